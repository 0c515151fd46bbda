"""How far a calibration is to be trusted: it replays each run it was fitted on.

A calibration that cannot replay its own runs has left something out of the model; one
whose runs' step times spread widely was fitted on a noisy machine. Both are reported so
that a user can tell a model miss (error beyond the spread) from noise (spread as large as
the error). Kept apart from sim.calibration because it simulates: fitting does not.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from .calibration import Calibration
from .comparison import compute_level, median_interval, step_spread
from .engine import simulate
from .measured import MeasuredRun

QUALITY_LIMIT = 0.03  # self-replay error or step-time spread (IQR / median) worth a warning


def assess(calibration: Calibration, runs: Sequence[MeasuredRun]) -> Calibration:
    """`calibration` with its ``quality`` (quality_of) on the runs it was fitted on."""
    return replace(calibration, quality=quality_of(calibration, runs))


def quality_of(calibration: Calibration, runs: Sequence[MeasuredRun]) -> dict[str, Any]:
    """Per run: measured and simulated median step time, self-replay error, step-time spread
    (IQR / median; measured, and over the simulator's draws), the measured median's 95%
    interval (`sim.comparison.median_interval`, relative), compute level (its compute over the
    calibration's, `sim.comparison`) and peak activation bytes per rank, measured and simulated
    (a warning if they differ at all); and
    warnings for those beyond QUALITY_LIMIT (an error beyond it says whether it lies beyond the
    interval too: then more steps would not remove it), and for levels further apart than it
    (sim.calibration's module docstring)."""
    per_run, warnings = [], []
    for run in runs:
        costs = calibration.for_run(run)
        result = simulate(run.program, costs)
        simulated = result.step_time
        times = list(run.step_times)
        measured = float(np.median(times))
        entry = {
            "run": str(run.path), "schedule": run.program.schedule.name, "steps": len(times),
            "step_time_measured": measured, "step_time_simulated": simulated,
            "self_replay_error": (simulated - measured) / measured if measured else 0.0,
            "step_time_spread": step_spread(times),
            "step_time_spread_simulated": result.step_time_spread,
            "step_time_interval": list(median_interval(times)),
            "compute_level": compute_level(run, costs, calibration.dispatch_overhead).level,  # NaN: no compute
            "peak_activation_bytes_measured": [int(b) for b in run.summary["peak_activation_bytes"]],
            "peak_activation_bytes_simulated": list(result.peak_activation_bytes),
        }
        per_run.append(entry)
        # Byte counts are deterministic, so any difference is a miss of the memory model.
        if entry["peak_activation_bytes_simulated"] != entry["peak_activation_bytes_measured"]:
            warnings.append(f"{run.path}: the replay's peak activation bytes per rank "
                            f"{entry['peak_activation_bytes_simulated']} differ from the measured "
                            f"{entry['peak_activation_bytes_measured']}: the memory model misses")
        error, (low, high) = entry["self_replay_error"], entry["step_time_interval"]
        if abs(error) > QUALITY_LIMIT:
            where = ("beyond the measured median's 95% interval too: a model miss" if not low <= error <= high else
                     "but inside the measured median's 95% interval: the run's steps cannot tell it from noise")
            warnings.append(f"{run.path}: the calibration replays the run {100 * error:+.1f}% off its measured step "
                            f"time (beyond {100 * QUALITY_LIMIT:.0f}%, {where})")
        if entry["step_time_spread"] > QUALITY_LIMIT:
            warnings.append(f"{run.path}: its step times spread {100 * entry['step_time_spread']:.1f}% (IQR / "
                            f"median; beyond {100 * QUALITY_LIMIT:.0f}%): a noisy machine, predictions are as "
                            "uncertain")
    for entry in per_run:  # JSON has no NaN: a run without compute rows has no level
        if math.isnan(entry["compute_level"]):
            entry["compute_level"] = None
    levels = [entry["compute_level"] for entry in per_run if entry["compute_level"] is not None]
    if len(levels) > 1 and max(levels) / min(levels) - 1 > QUALITY_LIMIT:
        warnings.append(f"the runs computed at x{min(levels):.3f} to x{max(levels):.3f} of the fitted costs (beyond "
                        f"{100 * QUALITY_LIMIT:.0f}% apart): the machine's speed moved between them, or the runs' "
                        "actions cost what one set of costs cannot give them all")
    return {"runs": per_run, "warnings": warnings}
