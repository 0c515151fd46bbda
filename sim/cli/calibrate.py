"""`python -m sim calibrate RUN_DIR [RUN_DIR ...] -o costs.json`: fit the simulator's costs to
measured runs and report how well the fit replays them."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from schedules import ScheduleError

from ..calibration import calibrate_runs
from ..quality import assess
from ..costs import CostError
from ..measured import read_measured
from .args import fail


@dataclass(frozen=True)
class CalibrateOptions:
    """`sim calibrate` as typed values."""

    runs: tuple[str, ...]
    output: str
    json: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "CalibrateOptions":
        return cls(runs=tuple(args.runs), output=args.output, json=args.json)


def add_parser(subparsers) -> None:
    """Register `calibrate` on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "calibrate",
        help="fit compute, transfer and overhead costs to a measured run (python -m runtime --out DIR)",
        description=(
            "Read a run directory written by python -m runtime and fit the cost model: per-stage F/B (I/W) "
            "costs as fixed per-action + per-layer terms (the shape from the run's profile.json of "
            "--profile-layers, the level from the run's steps), the executor's dispatch, send, receive and "
            "per-step overheads, point-to-point latency (in-run transfers) and bandwidth (ping-pong of "
            "--profile-p2p), and activation bytes per stage. The result predicts other schedules and "
            "microbatch counts of the same model at the same microbatch size: pass it as --costs to "
            "python -m sim compare --measured. Every parameter is documented in sim/calibration.py. "
            "Several runs of the same model and microbatch size are fitted alone and averaged, so that "
            "noise averages out. The report ends with each run's self-replay (measured vs simulated median "
            "step time) and step-time spread (IQR / median), stored in the JSON as quality, and a warning "
            "when either exceeds 3%."
        ),
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="run directories (timeline.csv, program.json, summary.json, ...)")
    parser.add_argument("-o", "--output", default="costs.json", metavar="FILE.json",
                        help="calibration file to write (default costs.json)")
    parser.add_argument("--json", action="store_true", help="print the calibration as JSON instead of a summary")
    parser.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    """Handle `sim calibrate`; returns the exit code."""
    options = CalibrateOptions.from_args(args)
    try:
        runs = [read_measured(run) for run in options.runs]
        calibration = assess(calibrate_runs(runs), runs)
        calibration.to_json(options.output)
    except (ScheduleError, CostError) as exc:
        return fail("calibrate", str(exc))
    except OSError as exc:
        return fail("calibrate", f"cannot write {options.output}: {exc.strerror or exc}")
    if options.json:
        print(json.dumps(calibration.to_dict(), indent=2))
    else:
        print(calibration.report())
        print(f"wrote {options.output}")
    return 0
