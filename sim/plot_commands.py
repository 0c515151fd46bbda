"""What `sim plot` does: simulate or read timelines, then draw them (and export traces)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from schedules import Schedule, ScheduleError, build, generator

from .calibration import Calibration
from .cost_args import costs_from_args, costs_or_calibration, given_cost_flags
from .costs import CostModel
from .engine import simulate
from .plot import plot_compare, plot_overlay, plot_timeline
from .plot_run import read_run, run_program
from .result import SimResult
from .trace import write_trace

MEMORY_UNIT_LABEL = "microbatch units"
MEMORY_UNIT_NOTE = "memory unit: one microbatch's activations of one rank's share"


def describe_costs(costs: CostModel | Calibration) -> str:
    """One line naming the compute (and transfer) costs, for figure titles."""
    if isinstance(costs, Calibration):
        source = costs.source
        return (f"costs: calibrated on a {source.get('schedule')} m={source.get('microbatches')} run of "
                f"{costs.model.get('model')} ({costs.num_layers} layers, {costs.rows} rows per microbatch)")
    def show(value) -> str:
        return f"{value:g} s" if isinstance(value, (int, float)) else "per stage"

    weight = costs.backward_weight or 0.0
    if costs.backward_full is None:
        parts = [f"F = {show(costs.forward)}", f"I = {show(costs.backward_input)}", f"W = {show(weight)}"]
        if isinstance(costs.backward_input, (int, float)) and isinstance(weight, (int, float)):
            parts.append(f"full B = I + W = {costs.backward_input + weight:g} s")
    else:
        parts = [f"F = {show(costs.forward)}", f"B = {show(costs.backward_full)}"]
    text = "costs per microbatch and rank share: " + ", ".join(parts)
    if costs.p2p_latency:
        text += f"; transfer latency {costs.p2p_latency:g} s"
    return text


def build_for(name: str, ranks: int, microbatches: int, chunks: int | None) -> Schedule:
    """Build `name`, passing `chunks` only to schedules that take a chunk count."""
    takes_chunks = generator(name).chunks is None
    return build(name, ranks=ranks, microbatches=microbatches, chunks=chunks if takes_chunks else None)


def simulate_named(names: Sequence[str], ranks: int, microbatches: int, chunks: int | None,
                   costs: CostModel | Calibration) -> dict[str, SimResult]:
    """Simulate each named schedule at one size; raises ScheduleError naming a bad one."""
    results = {}
    for name in names:
        schedule = build_for(name, ranks, microbatches, chunks)
        results[name] = simulate(schedule, model_for(costs, schedule))
    return results


def model_for(costs: CostModel | Calibration, schedule: Schedule) -> CostModel:
    """`costs` itself, or a calibration's cost model for the schedule's stages."""
    return costs.cost_model(schedule.num_stages) if isinstance(costs, Calibration) else costs


def overlay_costs(args: argparse.Namespace, run) -> CostModel:
    """Costs for simulating a measured run under it: the cost flags' model if any flag is
    given; else --costs (a cost model, or a calibration cut to the run's stages); else a
    calibration from the run itself (its replay)."""
    from .measured import read_measured
    from .measured_cli import resolve_costs

    if given_cost_flags(args):
        return costs_from_args(args)
    return resolve_costs(args.costs, read_measured(run.path))[0]


def _schedule_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ScheduleError("--compare needs at least one schedule name")
    return names


def execute(args: argparse.Namespace) -> list[Path]:
    """Run one `sim plot` invocation; returns the files written."""
    out = Path(args.output)
    written = [out]
    if args.run is not None:
        run = read_run(args.run)
        warmup = args.warmup
        if args.overlay:
            simulated = simulate(run_program(run), overlay_costs(args, run))
            plot_overlay(run.timeline, simulated.timeline, name=run.name, step=args.step, warmup=warmup,
                         path=out, dpi=args.dpi)
        else:
            plot_timeline(run.timeline, run.memory if args.memory else None, name=run.name, step=args.step,
                          warmup=warmup, comm=args.comm, path=out, dpi=args.dpi)
        if args.trace:
            write_trace(args.trace, run.timeline, run.memory, step=args.step, warmup=warmup, name=run.name)
            written.append(Path(args.trace))
        return written
    if args.step is not None or args.warmup or args.overlay:
        raise ScheduleError("--step, --warmup and --overlay apply to a measured run (--run DIR)")
    costs = costs_or_calibration(args)
    if args.compare is not None:
        if args.trace:
            raise ScheduleError("--trace writes one timeline: use it with --schedule or --run, not --compare")
        results = simulate_named(_schedule_names(args.compare), args.ranks, args.microbatches, args.chunks, costs)
        note = describe_costs(costs) + (f"\n{MEMORY_UNIT_NOTE}" if args.memory else "")
        plot_compare(
            {name: r.timeline for name, r in results.items()},
            memories={name: r.memory for name, r in results.items()} if args.memory else None,
            unit_bytes={name: r.activation_unit_bytes for name, r in results.items()},
            unit_label=MEMORY_UNIT_LABEL, comm=args.comm, note=note, path=out, dpi=args.dpi,
        )
        return written
    # One named schedule: an explicit --chunks it cannot take is an error, not ignored.
    schedule = build(args.schedule, ranks=args.ranks, microbatches=args.microbatches, chunks=args.chunks)
    result = simulate(schedule, model_for(costs, schedule))
    note = describe_costs(costs) + (f"\n{MEMORY_UNIT_NOTE}" if args.memory else "")
    plot_timeline(result.timeline, result.memory if args.memory else None, name=args.schedule, comm=args.comm,
                  unit_bytes=result.activation_unit_bytes, unit_label=MEMORY_UNIT_LABEL, note=note, path=out,
                  dpi=args.dpi)
    if args.trace:
        write_trace(args.trace, result.timeline, result.memory, name=args.schedule)
        written.append(Path(args.trace))
    return written
