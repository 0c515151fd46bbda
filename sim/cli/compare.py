"""`python -m sim compare`: simulate several schedules at one size and print one row each;
with --measured, a run's own program simulated and set beside the run."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import schedules
from schedules import ScheduleError

from .. import sweep
from ..comparison import compare_run
from ..costs import CostError, CostModel, CostSource
from ..measured import read_measured
from ..plot.units import byte_unit, time_unit
from ..sources import CostOverrides, cost_source, costs_for_run, real_activation_bytes
from .args import (
    add_cost_arguments, add_memory_limit_argument, cost_overrides, fail, memory_limit_unused, names, positive_int,
)

# --sort keys: the record field each orders by, smallest first.
SORT_KEYS = {"makespan": "makespan", "memory": "peak_activation_bytes", "bubble": "bubble_ratio",
             "rank-span-bubble": "bubble_ratio_rank_span", "name": "schedule"}
SIZE_FLAGS = ("schedules", "ranks", "microbatches", "chunks")


@dataclass(frozen=True)
class CompareOptions:
    """`sim compare` as typed values (None: not given)."""

    schedules: tuple[str, ...] | None
    ranks: int | None
    microbatches: int | None
    chunks: int | None
    measured: str | None
    overlay: str | None
    costs: str | None
    overrides: CostOverrides
    memory_limit: float | None
    json: bool
    csv: bool
    sort: str | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "CompareOptions":
        return cls(
            schedules=None if args.schedules is None else tuple(args.schedules), ranks=args.ranks,
            microbatches=args.microbatches, chunks=args.chunks, measured=args.measured, overlay=args.overlay,
            costs=args.costs, overrides=cost_overrides(args), memory_limit=args.memory_limit, json=args.json,
            csv=args.csv, sort=args.sort,
        )

    def sizes_given(self) -> list[str]:
        """The size flags given, as typed."""
        return [f"--{name}" for name in SIZE_FLAGS if getattr(self, name) is not None]


def add_parser(subparsers) -> None:
    """Register `compare` on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "compare",
        help="simulate schedules at one size and compare makespan, bubble and peak activation memory",
        description=(
            "Simulate each schedule at p ranks, m microbatches and v chunks per rank (schedules with "
            "a fixed chunk count, such as gpipe, 1f1b or zbv, run with their own) and print the costs used, "
            "then one row per schedule: makespan and time per microbatch (s, ms or µs), bubble ratio "
            "(idle / (p x makespan), percent), the zero-bubble paper's rank-span bubble (percent), peak activation "
            "memory in microbatches of a rank's own stages (and in bytes when activation sizes are given), "
            "and which rows are best by makespan and by memory. Default costs: F = I = W = 1 s (a "
            "transformer's backward, twice the forward, split evenly). A schedule that cannot run at these "
            "sizes is skipped with its reason on stderr; only an empty table is an error."
        ),
    )
    parser.add_argument("--schedules", type=names, metavar="A,B,...", help="schedules to run (default: all)")
    parser.add_argument("--ranks", type=positive_int, metavar="P", help="pipeline ranks p (default 4)")
    parser.add_argument("--microbatches", type=positive_int, metavar="M", help="microbatches m (default 8)")
    parser.add_argument(
        "--chunks", type=positive_int, metavar="V", help="stages per rank v for schedules that take it (default 2)",
    )
    add_memory_limit_argument(parser)
    measured = parser.add_argument_group(
        "measured run", "compare a run directory of python -m runtime with the simulation of its own program",
    )
    measured.add_argument(
        "--measured", metavar="RUN_DIR",
        help="simulate the run's program and report measured vs simulated step time, makespan, start-time error, "
        "bubble ratio and peak activation memory; costs from --costs (a cost model, or a calibration from "
        "python -m sim calibrate), else calibrated from the run itself",
    )
    measured.add_argument("--overlay", metavar="FILE.png", help="with --measured: write the overlay timeline figure")
    add_cost_arguments(parser)
    parser.add_argument(
        "--sort", choices=tuple(SORT_KEYS), metavar="|".join(SORT_KEYS),
        help="order the rows by this measure, best first (default: registration order); the text table "
        "marks the best rows by makespan and by peak activation memory either way",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--json", action="store_true",
        help="print a JSON list of objects: schedule, ranks, microbatches, chunks, makespan, step_time, "
        "time_per_microbatch (seconds), bubble_ratio, bubble_ratio_rank_span, bubble_fraction (fractions), "
        "peak_microbatches and peak_microbatches_per_rank (microbatches of a rank's own stages), peak_activation "
        "(max over ranks) and peak_activation_per_rank (microbatches of the mean rank's share), "
        "peak_activation_bytes (max over ranks) and peak_activation_bytes_per_rank; with --measured "
        "one object (see sim/comparison.py)",
    )
    output.add_argument("--csv", action="store_true", help="print the table as CSV")
    parser.set_defaults(handle=handle)


def _fail(message: str) -> int:
    return fail("compare", message)


def handle(args: argparse.Namespace) -> int:
    """Handle `sim compare`; returns the exit code."""
    options = CompareOptions.from_args(args)
    if options.measured is not None:
        return compare_measured(options)
    if options.overlay is not None:
        return _fail("--overlay draws a measured run: give --measured RUN_DIR")
    ranks = 4 if options.ranks is None else options.ranks
    microbatches = 8 if options.microbatches is None else options.microbatches
    chunks = 2 if options.chunks is None else options.chunks
    chosen = options.schedules or schedules.available()
    refusal = memory_limit_unused(options.memory_limit, chosen)
    if refusal:
        return _fail(refusal)
    try:
        costs = cost_source(options.costs, options.overrides)
        configs = sweep.combinations(chosen, [ranks], [microbatches], [chunks])
        records, skipped = sweep.simulate_records(configs, costs, memory_limit=options.memory_limit)
    except (ScheduleError, CostError) as exc:
        return _fail(str(exc))
    # One behaviour with sweep: a schedule that cannot run here is skipped with its reason, and
    # only an empty table is an error.
    if not records:
        return _fail("no schedule can run at these sizes: " + "; ".join(f"{c}: {r}" for c, r in skipped))
    for config, reason in skipped:
        print(f"sim compare: skipping {config}: {reason}", file=sys.stderr)
    for line in sweep.note_lines(records, "sim compare"):
        print(line, file=sys.stderr)
    if options.sort:
        records.sort(key=lambda r: r[SORT_KEYS[options.sort]])  # stable: ties keep registration order
    if options.json:
        print(json.dumps(records, indent=2))
        return 0
    if options.csv:
        print(sweep.table(records).to_csv(index=False), end="")
        return 0
    print(f"p={ranks} ranks, m={microbatches} microbatches, v={chunks} stages per rank where a schedule takes v")
    print(costs_line(costs, options))
    print(text_table(records, real_activation_bytes(costs)))
    return 0


def costs_line(costs: CostSource, options: CompareOptions) -> str:
    """The costs a table was simulated with, saying when they are the defaults."""
    text = costs.describe().removeprefix("costs: ")
    if isinstance(costs, CostModel):
        text += memory_phrase(costs)
    if options.costs is None and not options.overrides.given():
        text += " (defaults, transformer-like; set --forward, --backward, --weight or --costs)"
    return text


def memory_phrase(costs: CostModel) -> str:
    """What a cost model says about activation memory, for the costs line ('' when nothing)."""
    parts = []
    if real_activation_bytes(costs) and isinstance(costs.activation_memory, (int, float)):
        unit, divisor = byte_unit(costs.activation_memory)
        parts.append(f"activations {costs.activation_memory / divisor:.4g} {unit} per microbatch and rank share")
    if costs.weight_memory is None and costs.weight_memory_fraction:
        parts.append(f"W keeps {costs.weight_memory_fraction:.0%} of them from I until W")
    return "; " + ", ".join(parts) if parts else ""


def text_table(records: list[dict], real_bytes: bool) -> str:
    """The text table of `sim compare`: every header names its unit (time in s, ms or µs after
    the longest makespan; bubbles in percent; peak activation in microbatches, and in bytes when
    they are real), followed by a line saying which memory numbers are bytes."""
    label, factor = time_unit(max(r["makespan"] for r in records))
    columns = {
        "schedule": [r["schedule"] for r in records],
        "ranks": [r["ranks"] for r in records],
        "microbatches": [r["microbatches"] for r in records],
        "chunks": [r["chunks"] for r in records],
        f"makespan [{label}]": [r["makespan"] * factor for r in records],
        f"per_microbatch [{label}]": [r["time_per_microbatch"] * factor for r in records],
        "bubble_ratio [%]": [100 * r["bubble_ratio"] for r in records],
        "rank_span_bubble [%]": [100 * r["bubble_ratio_rank_span"] for r in records],
        "peak_act [microbatches]": [r["peak_microbatches"] for r in records],
    }
    best_time, best_memory = best_rows(records, "makespan"), best_rows(records, "peak_activation_bytes")
    formats = {f"makespan [{label}]": "{:.6g}", f"per_microbatch [{label}]": "{:.6g}", "bubble_ratio [%]": "{:.2f}",
               "rank_span_bubble [%]": "{:.2f}", "peak_act [microbatches]": "{:.3g}"}
    if real_bytes:
        unit, divisor = byte_unit(max(r["peak_activation_bytes"] for r in records))
        columns[f"peak_act [{unit}]"] = [r["peak_activation_bytes"] / divisor for r in records]
        formats[f"peak_act [{unit}]"] = "{:.4g}"
        memory = (f"memory: peak_act [{unit}] is real bytes (max over ranks); peak_act [microbatches] is a count "
                  "(GPipe: m)")
    else:
        memory = ("memory: peak_act [microbatches] is a count (GPipe: m); no bytes: no activation size given "
                  "(--activation-bytes)")
    columns["best"] = ["+".join(what for what, rows in (("makespan", best_time), ("memory", best_memory)) if i in rows)
                       for i in range(len(records))]
    return aligned(columns, formats) + "\n" + memory


def best_rows(records: list[dict], key: str) -> set[int]:
    """Indices of the rows with the smallest `key` (ties within a relative 1e-9 all count): the
    best by makespan, or by peak activation bytes (max over ranks; the same model's bytes in
    every row, so the placeholder ranks schedules as real sizes would)."""
    low = min(r[key] for r in records)
    return {i for i, r in enumerate(records) if r[key] <= low * (1 + 1e-9)}


def aligned(columns: dict[str, list], formats: dict[str, str]) -> str:
    """A plain text table: text columns left-aligned, numbers right-aligned, two spaces apart."""
    cells = {name: [formats.get(name, "{}").format(x) for x in values] for name, values in columns.items()}
    widths = {name: max(len(name), *map(len, values)) for name, values in cells.items()}
    lines = []
    for i in range(-1, len(next(iter(cells.values())))):
        parts = []
        for name, values in cells.items():
            text = name if i < 0 else values[i]
            numeric = name in formats or isinstance(columns[name][0], int)
            parts.append(text.rjust(widths[name]) if numeric else text.ljust(widths[name]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def compare_measured(options: CompareOptions) -> int:
    """`sim compare --measured RUN_DIR`: the run's own program simulated and set beside the run."""
    sizes = options.sizes_given()
    if sizes:
        return _fail(f"--measured simulates the run's own program: drop {', '.join(sizes)}")
    flags = options.overrides.given()
    if flags:
        return _fail(f"--measured takes its costs from --costs FILE or from the run itself: drop {', '.join(flags)}")
    if options.csv:
        return _fail("--measured prints a table or, with --json, one JSON object (not --csv)")
    try:
        measured = read_measured(options.measured)
        costs, origin, dispatch, notes = costs_for_run(options.costs, measured)
        comparison, result = compare_run(measured, costs, dispatch)
        if options.overlay:
            from ..plot import plot_overlay

            schedule = measured.program.schedule
            plot_overlay(measured.timeline, result.timeline, path=options.overlay,
                         name=f"{schedule.name} p={schedule.ranks} m={schedule.microbatches} v={schedule.chunks}")
    except (ScheduleError, CostError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot write {options.overlay}: {exc.strerror or exc}")
    if options.json:
        print(json.dumps({**comparison.to_dict(), "beyond_calibration": [
            {"topic": note.topic.value, "note": note.text} for note in notes]}, indent=2))
    else:
        print(comparison.report(origin))
        for note in notes:
            print(f"beyond the calibration's runs ({note.topic.value}): it {note.text}")
        if options.overlay:
            print(f"wrote {options.overlay}")
    return 0
