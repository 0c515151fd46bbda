"""The `plot` and `figures` subcommands of `python -m sim` (registered by sim/cli.py)."""

from __future__ import annotations

import argparse
import sys

from .cost_args import add_cost_arguments, positive_int


def add_parser(subparsers) -> None:
    """Register `plot` and `figures` on an argparse subparsers object."""
    plot = subparsers.add_parser(
        "plot",
        help="draw a Gantt timeline (and memory, trace) of a schedule, several schedules or a run",
        description=(
            "Draw the timeline of a simulated schedule (--schedule), of several schedules on a "
            "shared time axis (--compare), or of a measured run directory (--run)."
        ),
    )
    source = plot.add_mutually_exclusive_group(required=True)
    source.add_argument("--schedule", help="schedule name to simulate and plot")
    source.add_argument("--compare", metavar="A,B,...", help="comma-separated schedules, one panel each")
    source.add_argument("--run", metavar="DIR", help="measured run directory (timeline.csv, memory.csv, ...)")
    plot.add_argument("--ranks", type=positive_int, default=4, help="pipeline ranks p (default 4)")
    plot.add_argument("--microbatches", type=positive_int, default=8, help="microbatches m (default 8)")
    plot.add_argument(
        "--chunks", type=positive_int, default=None,
        help="stages per rank v for schedules that take it (default: the schedule's own, 2 for interleaved)",
    )
    plot.add_argument("-o", "--output", required=True, metavar="PNG", help="image file to write")
    plot.add_argument(
        "--memory", action="store_true",
        help="add activation-memory curves under the timeline (one panel per schedule with --compare)",
    )
    plot.add_argument("--trace", metavar="JSON", help="also write a Perfetto/Chrome trace (not with --compare)")
    plot.add_argument("--comm", action="store_true", help="draw sends and receive waits on thin lanes per rank")
    add_cost_arguments(plot)
    measured = plot.add_argument_group("measured runs")
    measured.add_argument("--step", type=int, default=None, help="step to plot (default: the step of median makespan)")
    measured.add_argument(
        "--warmup", type=int, default=0,
        help="leading recorded steps to leave out of the median (default 0: the executor does not "
        "record its warm-up steps)",
    )
    measured.add_argument(
        "--overlay", action="store_true",
        help="simulate the run's program.json and draw it under the measurement: with the cost flags if any "
        "is given, else with --costs (a cost model or a calibration), else calibrated from the run itself",
    )
    plot.add_argument("--dpi", type=positive_int, default=150, help="image resolution (default 150)")
    plot.set_defaults(func=run_plot)

    figures = subparsers.add_parser(
        "figures", help="regenerate the figures README shows",
        description="Regenerate every figure in figures/ that README shows.",
    )
    figures.add_argument("--out", default="figures", metavar="DIR", help="directory to write (default figures)")
    figures.set_defaults(func=run_figures)


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fail(command: str, message: str) -> int:
    print(f"sim {command}: error: {message}", file=sys.stderr)
    return 2


def run_plot(args: argparse.Namespace) -> int:
    """Handle `sim plot`; returns the exit code."""
    from schedules import ScheduleError

    from .plot_commands import execute

    try:
        for path in execute(args):
            print(path)
    except (ScheduleError, ValueError, OSError) as exc:
        return _fail("plot", _one_line(exc))
    return 0


def run_figures(args: argparse.Namespace) -> int:
    """Handle `sim figures`; returns the exit code."""
    from schedules import ScheduleError

    from .plot_figures import regenerate

    try:
        for path in regenerate(args.out):
            print(path)
    except (ScheduleError, ValueError, OSError) as exc:
        return _fail("figures", _one_line(exc))
    return 0
