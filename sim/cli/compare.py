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
from ..costs import CostError
from ..measured import read_measured
from ..sources import CostOverrides, cost_source, costs_for_run
from .args import (
    add_cost_arguments, add_memory_limit_argument, cost_overrides, fail, memory_limit_unused, names, positive_int,
)

TEXT_COLUMNS = (
    "schedule", "ranks", "microbatches", "chunks", "makespan", "time_per_microbatch", "bubble_ratio",
    "bubble_ratio_rank_span", "peak_activation",
)
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

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "CompareOptions":
        return cls(
            schedules=None if args.schedules is None else tuple(args.schedules), ranks=args.ranks,
            microbatches=args.microbatches, chunks=args.chunks, measured=args.measured, overlay=args.overlay,
            costs=args.costs, overrides=cost_overrides(args), memory_limit=args.memory_limit, json=args.json,
            csv=args.csv,
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
            "a fixed chunk count, such as gpipe, 1f1b or zbv, run with their own) and print one row per "
            "schedule: makespan, time per microbatch, bubble ratio (idle / (p x makespan)), the same "
            "within each rank's own span, and peak activation memory (max over ranks, in microbatches "
            "of one rank's share). Without --schedules every registered schedule that is legal at "
            "these sizes runs; the others are noted on stderr."
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
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--json", action="store_true",
        help="print a JSON list of objects: schedule, ranks, microbatches, chunks, makespan, step_time, "
        "time_per_microbatch, bubble_ratio, bubble_ratio_rank_span, bubble_fraction, peak_activation "
        "(max over ranks) and peak_activation_per_rank (microbatches of one rank's share), "
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
        records = []
        for config in sweep.combinations(chosen, [ranks], [microbatches], [chunks]):
            try:
                schedule = sweep.build(config, costs, options.memory_limit)
            except ScheduleError as exc:
                if options.schedules:
                    return _fail(f"{config}: {exc}")
                print(f"sim compare: skipping {config}: {exc}", file=sys.stderr)
                continue
            records.append(sweep.row(schedule, costs.for_stages(schedule.num_stages)))
    except (ScheduleError, CostError) as exc:
        return _fail(str(exc))
    if not records:
        return _fail("no schedule is legal at these sizes")
    if options.json:
        print(json.dumps(records, indent=2))
        return 0
    table = sweep.table(records)
    if options.csv:
        print(table.to_csv(index=False), end="")
    else:
        print(table[list(TEXT_COLUMNS)].to_string(index=False, float_format=lambda x: f"{x:.6g}"))
    return 0


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
        costs, origin = costs_for_run(options.costs, measured)
        comparison, result = compare_run(measured, costs)
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
        print(json.dumps(comparison.to_dict(), indent=2))
    else:
        print(comparison.report(origin))
        if options.overlay:
            print(f"wrote {options.overlay}")
    return 0
