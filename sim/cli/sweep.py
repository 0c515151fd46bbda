"""`python -m sim sweep`: simulate every combination of schedules and sizes into one table."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import schedules
from schedules import ScheduleError

from .. import sweep
from ..costs import CostError
from ..sources import CostOverrides, cost_source
from .args import (
    add_cost_arguments, add_memory_limit_argument, cost_overrides, fail, memory_limit_unused, names, positive_ints,
)


@dataclass(frozen=True)
class SweepOptions:
    """`sim sweep` as typed values."""

    schedules: tuple[str, ...] | None
    ranks: tuple[int, ...]
    microbatches: tuple[int, ...]
    chunks: tuple[int, ...]
    costs: str | None
    overrides: CostOverrides
    out: str | None  # as typed: messages quote it
    progress: bool
    memory_limit: float | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SweepOptions":
        return cls(
            schedules=None if args.schedules is None else tuple(args.schedules), ranks=tuple(args.ranks),
            microbatches=tuple(args.microbatches), chunks=tuple(args.chunks), costs=args.costs,
            overrides=cost_overrides(args), out=args.out or None, progress=not args.no_progress,
            memory_limit=args.memory_limit,
        )


def add_parser(subparsers) -> None:
    """Register `sweep` on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "sweep",
        help="simulate every combination of schedules, p, m and v into one table (CSV or JSON)",
        description=(
            "Simulate every combination of the given schedules, ranks, microbatches and chunks "
            "(chunks only vary schedules that take it) under one cost model (or a calibration, which cuts "
            "its model into each schedule's stages) and write one table, "
            "one row per configuration, with the columns: " + ", ".join(sweep.TABLE_COLUMNS) + " (times in seconds, "
            "bubbles as fractions of 1, peak_activation in microbatches of the mean rank's share, "
            "peak_microbatches in microbatches of a rank's own stages, peak_activation_bytes in bytes; README "
            "'Simulating' defines each). "
            "Combinations a schedule cannot run are skipped and counted on stderr. Read it back with "
            "pandas.read_csv (or pandas.read_json for --out FILE.json)."
        ),
    )
    parser.add_argument("--schedules", type=names, metavar="A,B,...", help="schedules (default: all registered)")
    parser.add_argument("--ranks", type=positive_ints, default=[4], metavar="P,...", help="ranks (default 4)")
    parser.add_argument(
        "--microbatches", type=positive_ints, default=[4, 8, 16, 32], metavar="M,...",
        help="microbatches (default 4,8,16,32)",
    )
    parser.add_argument(
        "--chunks", type=positive_ints, default=[2, 4], metavar="V,...",
        help="chunks per rank for schedules that take it (default 2,4)",
    )
    add_cost_arguments(parser)
    add_memory_limit_argument(parser)
    parser.add_argument(
        "--out", metavar="FILE", help="write the table here (.csv, or .json for a list of records); default: CSV on stdout",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(handle=handle)


def _fail(message: str) -> int:
    return fail("sweep", message)


def handle(args: argparse.Namespace) -> int:
    """Handle `sim sweep`; returns the exit code."""
    from tqdm import tqdm

    options = SweepOptions.from_args(args)
    out = Path(options.out) if options.out else None
    if out is not None and out.suffix not in (".csv", ".json"):
        return _fail(f"--out must end in .csv or .json, got {options.out!r}")

    def progress(items):
        return tqdm(items, total=len(items), desc="sweep", unit="config", file=sys.stderr, disable=not options.progress)

    chosen = options.schedules or schedules.available()
    refusal = memory_limit_unused(options.memory_limit, chosen)
    if refusal:
        return _fail(refusal)
    try:
        costs = cost_source(options.costs, options.overrides)
        configs = sweep.combinations(chosen, options.ranks, options.microbatches, options.chunks)
        frame, skipped, notes = sweep.simulate_all(configs, costs, progress=progress, memory_limit=options.memory_limit)
    except (ScheduleError, CostError) as exc:
        return _fail(str(exc))
    if skipped:
        examples = "; ".join(f"{config}: {reason}" for config, reason in skipped[:2])
        print(f"sim sweep: skipped {len(skipped)} of {len(configs)} configurations (e.g. {examples})", file=sys.stderr)
    if frame.empty:
        return _fail("no configuration is legal")
    for line in notes:
        print(line, file=sys.stderr)
    try:
        if out is None:
            print(frame.to_csv(index=False), end="")
        elif out.suffix == ".csv":
            frame.to_csv(out, index=False)
        else:
            frame.to_json(out, orient="records", indent=2)
    except OSError as exc:
        return _fail(f"cannot write {out}: {exc.strerror or exc}")
    if out is not None:
        print(f"sim sweep: wrote {len(frame)} rows to {out}", file=sys.stderr)
    return 0
