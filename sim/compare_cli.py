"""`python -m sim compare`: simulate several schedules at one size and print one row each."""

from __future__ import annotations

import argparse
import json
import sys

import schedules
from schedules import ScheduleError

from . import measured_cli, sweep
from .cost_args import add_cost_arguments, costs_or_calibration, names, positive_int
from .calibration import Calibration
from .costs import CostError

TEXT_COLUMNS = (
    "schedule", "ranks", "microbatches", "chunks", "makespan", "time_per_microbatch", "bubble_ratio",
    "bubble_ratio_rank_span", "peak_activation",
)


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
    parser.set_defaults(func=run)


def _fail(message: str) -> int:
    print(f"sim compare: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Handle `sim compare`; returns the exit code."""
    if args.measured is not None:
        return measured_cli.run(args, _fail)
    if args.overlay is not None:
        return _fail("--overlay draws a measured run: give --measured RUN_DIR")
    args.ranks = 4 if args.ranks is None else args.ranks
    args.microbatches = 8 if args.microbatches is None else args.microbatches
    args.chunks = 2 if args.chunks is None else args.chunks
    try:
        costs = costs_or_calibration(args)
        chosen = args.schedules or schedules.available()
        configs = sweep.grid(chosen, [args.ranks], [args.microbatches], [args.chunks])
        records = []
        for config in configs:
            try:
                schedule = sweep.build(config)
            except ScheduleError as exc:
                if args.schedules:
                    return _fail(f"{config}: {exc}")
                print(f"sim compare: skipping {config}: {exc}", file=sys.stderr)
                continue
            model = costs.cost_model(schedule.num_stages) if isinstance(costs, Calibration) else costs
            records.append(sweep.summarize(schedule, model))
    except (ScheduleError, CostError) as exc:
        return _fail(str(exc))
    if not records:
        return _fail("no schedule is legal at these sizes")
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    table = sweep.table(records)
    if args.csv:
        print(table.to_csv(index=False), end="")
    else:
        print(table[list(TEXT_COLUMNS)].to_string(index=False, float_format=lambda x: f"{x:.6g}"))
    return 0

