"""`python -m sim plot`: draw a simulated schedule, several schedules, or a measured run (and traces)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from schedules import ScheduleError, available, build

from .. import sweep
from ..costs import CostError
from ..engine import simulate
from ..measured import read_run
from ..sources import CostOverrides, cost_source, real_activation_bytes, run_costs
from .args import add_cost_arguments, cost_overrides, fail, one_line, positive_int


@dataclass(frozen=True)
class PlotOptions:
    """`sim plot` as typed values: exactly one of `schedule`, `compare`, `run` is set."""

    schedule: str | None
    compare: tuple[str, ...] | None
    run: str | None
    sweep: str | None
    ranks: int | None
    microbatches: int | None
    chunks: int | None
    output: Path
    memory: bool
    trace: Path | None
    comm: bool
    costs: str | None
    overrides: CostOverrides
    step: int | str | None  # a step, "all", or None (the median)
    warmup: int
    overlay: bool
    dpi: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "PlotOptions":
        """Typed options; ScheduleError for an empty --compare list."""
        compare = None
        if args.compare is not None:
            compare = tuple(n.strip() for n in args.compare.split(",") if n.strip())
            if not compare:
                raise ScheduleError("--compare needs at least one schedule name")
        return cls(
            schedule=args.schedule, compare=compare, run=args.run, sweep=args.sweep, ranks=args.ranks, microbatches=args.microbatches,
            chunks=args.chunks, output=Path(args.output), memory=args.memory,
            trace=Path(args.trace) if args.trace else None, comm=args.comm, costs=args.costs,
            overrides=cost_overrides(args), step=args.step, warmup=args.warmup, overlay=args.overlay, dpi=args.dpi,
        )


def step_choice(text: str) -> int | str:
    """argparse type of --step: a step number or 'all'."""
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a step number or 'all', got {text!r}") from None


def add_parser(subparsers) -> None:
    """Register `plot` on an argparse subparsers object."""
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
    source.add_argument(
        "--sweep", metavar="FILE",
        help="a table of python -m sim sweep (.csv or .json): time per microbatch and bubble ratio against m, "
        "one line per schedule, one column of panels per p",
    )
    plot.add_argument("--ranks", type=positive_int, help="pipeline ranks p (default 4)")
    plot.add_argument("--microbatches", type=positive_int, help="microbatches m (default 8)")
    plot.add_argument(
        "--chunks", type=positive_int, default=None,
        help="stages per rank v for schedules that take it (default: the schedule's own, 2 for interleaved)",
    )
    plot.add_argument(
        "-o", "--output", required=True, metavar="FILE",
        help="image file to write, exactly this path; format from its extension (.png, .svg, .pdf, ...), PNG if none",
    )
    plot.add_argument(
        "--memory", action="store_true",
        help="add activation-memory curves under the timeline (one panel per schedule with --compare)",
    )
    plot.add_argument("--trace", metavar="JSON", help="also write a Perfetto/Chrome trace (not with --compare)")
    plot.add_argument("--comm", action="store_true", help="draw sends and receive waits on thin lanes per rank")
    add_cost_arguments(plot)
    measured = plot.add_argument_group("measured runs")
    measured.add_argument(
        "--step", type=step_choice, default=None, metavar="N|all",
        help="step to draw: N, or 'all' (every step back to back; not with --overlay); default: the step of "
        "median makespan, and with --overlay each action's median start and end over the steps",
    )
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
    plot.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    """Handle `sim plot`; returns the exit code."""
    try:
        for path in draw(PlotOptions.from_args(args)):
            print(path)
    except (ScheduleError, ValueError, OSError) as exc:
        return fail("plot", one_line(exc))
    return 0


def unused(options: PlotOptions) -> str | None:
    """Why an option given would change nothing here (refused, never silently ignored), or None."""
    if options.sweep is not None:
        given = [f"--{n}" for n in ("ranks", "microbatches", "chunks", "trace") if getattr(options, n) is not None]
        given += [f for f, on in (("--memory", options.memory), ("--comm", options.comm), ("--overlay", options.overlay),
                                  ("--costs", options.costs)) if on] + options.overrides.given()
        if given:
            return f"--sweep draws the table as it is: drop {', '.join(given)}"
    if options.run is not None:
        sizes = [f"--{n}" for n in ("ranks", "microbatches", "chunks") if getattr(options, n) is not None]
        if sizes:
            return f"a run is drawn at its own sizes: drop {', '.join(sizes)}"
        costs = options.overrides.given() + (["--costs"] if options.costs else [])
        if costs and not options.overlay:
            return f"{', '.join(costs)} only cost the simulation that --overlay draws beside the run"
        if options.overlay and (options.memory or options.comm):
            flags = " and ".join(f for f, on in (("--memory", options.memory), ("--comm", options.comm)) if on)
            return f"--overlay draws compute only: drop {flags}, or plot the run without --overlay"
    return None


def draw(options: PlotOptions) -> list[Path]:
    """Draw what `options` ask for; returns the files written."""
    refusal = unused(options)
    if refusal:
        raise ScheduleError(refusal)
    from ..plot.figure import image_format

    image_format(options.output)  # an unknown extension fails before any simulation
    if options.run is not None:
        return draw_run(options)
    if options.sweep is not None:
        return draw_sweep(options)
    options = replace(options, ranks=options.ranks or 4, microbatches=options.microbatches or 8)
    if options.step is not None or options.warmup or options.overlay:
        raise ScheduleError("--step, --warmup and --overlay apply to a measured run (--run DIR)")
    if options.compare is not None and options.trace:
        raise ScheduleError("--trace writes one timeline: use it with --schedule or --run, not --compare")
    from ..plot import plot_compare, plot_timeline  # matplotlib loads only for the commands that draw
    from ..plot.style import MEMORY_UNIT_LABEL, MEMORY_UNIT_NOTE
    from ..plot.trace import write_trace

    costs = cost_source(options.costs, options.overrides)
    # Memory in bytes when activation sizes were given, else in units of one microbatch's
    # activations of one rank's share (the 1 GiB placeholder's bytes would mean nothing).
    real = real_activation_bytes(costs)
    note = costs.describe() + (f"\n{'memory: activation bytes' if real else MEMORY_UNIT_NOTE}" if options.memory else "")
    label = None if real else MEMORY_UNIT_LABEL
    if options.compare is not None:
        results = compare_results(options, costs)
        plot_compare(
            {name: r.timeline for name, r in results.items()},
            memories={name: r.memory for name, r in results.items()} if options.memory else None,
            unit_bytes=None if real else {name: r.activation_unit_bytes for name, r in results.items()},
            unit_label=label, comm=options.comm, note=note, path=options.output, dpi=options.dpi,
        )
        return [options.output]
    # One named schedule: an explicit --chunks it cannot take is an error, not ignored.
    schedule = build(options.schedule, ranks=options.ranks, microbatches=options.microbatches, chunks=options.chunks)
    result = simulate(schedule, costs.for_stages(schedule.num_stages))
    unit_bytes = None if real else result.activation_unit_bytes
    plot_timeline(result.timeline, result.memory if options.memory else None, name=options.schedule,
                  comm=options.comm, unit_bytes=unit_bytes, unit_label=label,
                  note=note, path=options.output, dpi=options.dpi)
    if options.trace:
        write_trace(options.trace, result.timeline, result.memory, name=options.schedule, unit_bytes=unit_bytes)
        return [options.output, options.trace]
    return [options.output]


def compare_results(options: PlotOptions, costs) -> dict:
    """Each --compare schedule simulated; one that cannot run at these sizes is skipped with its
    reason on stderr, as in `sim compare` and `sim sweep`; ScheduleError if none is left (or for
    an unknown name)."""
    known = available()
    unknown = [name for name in options.compare if name not in known]
    if unknown:
        raise ScheduleError(f"unknown schedule {unknown[0]!r}; available: {', '.join(known)}")
    results, skipped = {}, []
    for name in options.compare:
        try:
            results.update(sweep.simulate_each([name], options.ranks, options.microbatches, options.chunks, costs))
        except (ScheduleError, CostError) as exc:
            skipped.append(f"{name}: {one_line(exc)}")
    if not results:
        raise ScheduleError("no schedule can run at these sizes: " + "; ".join(skipped))
    for reason in skipped:
        print(f"sim plot: skipping {reason}", file=sys.stderr)
    return results


def draw_sweep(options: PlotOptions) -> list[Path]:
    """A sweep table's curves (sim.plot.sweep)."""
    import pandas as pd

    from ..plot.sweep import plot_sweep

    path = Path(options.sweep)
    if path.suffix not in (".csv", ".json"):
        raise ScheduleError(f"--sweep reads a .csv or .json table of python -m sim sweep, got {options.sweep!r}")
    try:
        table = pd.read_csv(path) if path.suffix == ".csv" else pd.read_json(path)
    except (OSError, ValueError) as exc:
        raise ScheduleError(f"cannot read {options.sweep}: {one_line(exc)}") from None
    plot_sweep(table, note=f"python -m sim sweep table {path.name}", path=options.output, dpi=options.dpi)
    return [options.output]


def draw_run(options: PlotOptions) -> list[Path]:
    """A measured run's step, or (--overlay) the run beside the simulation of its own program."""
    from ..plot import plot_overlay, plot_timeline
    from ..plot.figure import steps_back_to_back
    from ..plot.trace import write_trace

    run = read_run(options.run)
    timeline, memory, step, name = run.timeline, run.memory, options.step, run.name
    warmup = options.warmup
    if step == "all":
        if options.overlay:
            raise ScheduleError("--overlay compares one step with the simulation: the median (default) or --step N")
        kept, timeline, memory = steps_back_to_back(timeline, memory, warmup)
        step, warmup, name = None, 0, f"{run.name}  ·  {kept} steps back to back"
    if options.overlay:
        simulated = simulate(run.program, run_costs(options.costs, options.overrides, run))
        plot_overlay(timeline, simulated.timeline, name=name, step=step, warmup=warmup,
                     path=options.output, dpi=options.dpi)
    else:
        plot_timeline(timeline, memory if options.memory else None, name=name, step=step,
                      warmup=warmup, comm=options.comm, path=options.output, dpi=options.dpi,
                      show_step=options.step != "all")
    if options.trace:
        write_trace(options.trace, timeline, memory, step=step, warmup=warmup, name=name)
        return [options.output, options.trace]
    return [options.output]
