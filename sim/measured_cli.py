"""`python -m sim compare --measured RUN_DIR`: a run's own program simulated and set beside the run."""

from __future__ import annotations

import argparse
import json
from typing import Callable

from schedules import ScheduleError

from .calibration import Calibration, calibrate, load_costs
from .cost_args import given_cost_flags
from .comparison import Comparison, compare_run
from .costs import CostError, CostModel
from .measured import MeasuredRun, read_measured

SIZE_FLAGS = ("schedules", "ranks", "microbatches", "chunks")


def run(args: argparse.Namespace, fail: Callable[[str], int]) -> int:
    """Handle `sim compare --measured`; `fail` prints one error line and returns 2."""
    sizes = [f"--{name}" for name in SIZE_FLAGS if getattr(args, name) is not None]
    if sizes:
        return fail(f"--measured simulates the run's own program: drop {', '.join(sizes)}")
    flags = given_cost_flags(args)
    if flags:
        return fail(f"--measured takes its costs from --costs FILE or from the run itself: drop {', '.join(flags)}")
    if args.csv:
        return fail("--measured prints a table or, with --json, one JSON object (not --csv)")
    try:
        measured = read_measured(args.measured)
        costs, origin = resolve_costs(args.costs, measured)
        comparison, result = compare_run(measured, costs)
        if args.overlay:
            from .plot import plot_overlay

            schedule = measured.program.schedule
            plot_overlay(measured.timeline, result.timeline, path=args.overlay,
                         name=f"{schedule.name} p={schedule.ranks} m={schedule.microbatches} v={schedule.chunks}")
    except (ScheduleError, CostError) as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"cannot write {args.overlay}: {exc.strerror or exc}")
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2))
    else:
        print(format_comparison(comparison, origin))
        if args.overlay:
            print(f"wrote {args.overlay}")
    return 0


def resolve_costs(path: str | None, measured: MeasuredRun) -> tuple[CostModel, str]:
    """The cost model for the run's program and a phrase saying where it came from."""
    if path is None:
        return calibrate(measured).cost_model_for_run(measured), "calibrated from this run (replay)"
    loaded = load_costs(path)
    if isinstance(loaded, Calibration):
        source = loaded.source
        origin = f"calibration {path} (from {source.get('schedule')} m={source.get('microbatches')}: {source.get('run')})"
        return loaded.cost_model_for_run(measured), origin
    return loaded, f"cost model {path}"


def format_comparison(c: Comparison, origin: str) -> str:
    """The text report: one line per quantity, measured beside simulated."""
    def ms(x: float) -> str:
        return f"{x * 1e3:.2f} ms"

    lines = [
        f"{c.run}: {c.schedule} p={c.ranks} m={c.microbatches} v={c.chunks}",
        f"costs: {origin}",
        f"{'':24}{'measured':>14}{'simulated':>14}{'error':>10}",
        f"{'step time (median)':24}{ms(c.step_time_measured):>14}{ms(c.step_time_simulated):>14}"
        f"{100 * c.step_time_error:>+9.1f}%",
        f"{'makespan (median)':24}{ms(c.makespan_measured):>14}{ms(c.makespan_simulated):>14}"
        f"{100 * c.makespan_error:>+9.1f}%",
        f"{'bubble ratio':24}{c.bubble_ratio_measured:>14.3f}{c.bubble_ratio_simulated:>14.3f}",
        f"start-time MAE: {100 * c.start_mae:.1f}% of the measured makespan",
    ]
    for rank, (m, s) in enumerate(zip(c.peak_activation_bytes_measured, c.peak_activation_bytes_simulated)):
        lines.append(f"{f'peak activation B, rank {rank}':24}{m:>14,}{s:>14,}")
    return "\n".join(lines)
