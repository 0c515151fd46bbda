"""Simulated vs measured: a run's own program simulated under a cost model, set beside the run.

Measured numbers are medians over the run's measured steps; the simulation is one step.

- ``step_time``: measured, barrier to barrier on rank 0 (``summary.json`` step_times);
  simulated, ``SimResult.step_time`` (makespan + step_overhead).
- ``makespan``: the latest end of any action of a step, on both sides.
- ``*_error``: signed relative error (simulated - measured) / measured.
- ``start_mae``: mean over every action of every measured step of |simulated start -
  measured start| (actions matched by rank and action text), over the measured
  makespan. Rank clocks in a run are aligned only at the step's barrier, so part of
  this is the ranks' clock offset, not the model.
- ``bubble_ratio``: idle compute time / (p x makespan), as schedules.timeline defines it.
- ``step_time_spread``: the run's measured step times, interquartile range over the median
  (an error within it may be the machine's noise rather than the model's miss).
- ``step_time_spread_simulated``: the same over the step times of the simulator's draws of
  the cost model's spread (sim.result.SimResult.step_time_spread; 0 without a spread): how much
  the calibrated machine's steps should vary for this program.
- ``step_time_interval``: a 95% interval of the measured median (`median_interval`,
  relative to it): an error inside it cannot be told from the run's own noise by its steps.
- ``peak_activation_bytes``: per rank; measured by the executor's saved-tensor meter
  (max over steps), simulated from the cost model's per-stage activation bytes.
- ``compute_measured``: the run's compute in a step, summed over ranks, mean over its steps but
  the stalled ones (`sim.calibration.typical_steps`, as every fit reads it): each
  compute row on a processor of its own (`sim.calibration.compute_frame`: where ranks shared
  cores, the integral of its share) plus the executor's loop gap per action that calibrated
  costs hold (``dispatch``, `Calibration.dispatch_overhead`); ``compute_simulated``: the cost
  model's typical compute of the same program (`sim.engine.compute_seconds`); ``compute_level``:
  measured / simulated. A level away from 1 says the run computed faster or slower than the
  costs, whether because the machine's speed moved since the calibration or because the costs
  price this program's actions wrongly.
- ``step_time_at_run_level`` and its error: the program simulated with every compute cost
  times ``compute_level`` (`CostModel.compute_scaled`): what is left of the error once the
  compute's level is the run's, i.e. the model's miss in how actions overlap, wait and spread.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from .calibration import compute_frame, typical_steps
from .costs import CostModel
from .engine import compute_seconds, simulate
from .measured import MeasuredRun
from .metrics import step_spread
from .result import SimResult


@dataclass(frozen=True)
class Comparison:
    """The numbers `python -m sim compare --measured` reports (definitions: module docstring)."""

    run: str
    schedule: str
    ranks: int
    microbatches: int
    chunks: int
    step_time_measured: float
    step_time_simulated: float
    step_time_error: float
    makespan_measured: float
    makespan_simulated: float
    makespan_error: float
    start_mae: float
    bubble_ratio_measured: float
    bubble_ratio_simulated: float
    peak_activation_bytes_measured: list[int]
    peak_activation_bytes_simulated: list[int]
    step_time_spread: float = 0.0
    step_time_interval: tuple[float, float] = (0.0, 0.0)
    step_time_spread_simulated: float = 0.0
    compute_measured: float = 0.0
    compute_simulated: float = 0.0
    compute_level: float = float("nan")
    step_time_at_run_level: float = float("nan")
    step_time_error_at_run_level: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        """As JSON-ready values (a level that could not be measured is null)."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}

    def report(self, origin: str) -> str:
        """The text report (`sim compare --measured`): one line per quantity, measured beside
        simulated; `origin` says where the costs came from."""
        def ms(x: float) -> str:
            return f"{x * 1e3:.2f} ms"

        lines = [
            f"{self.run}: {self.schedule} p={self.ranks} m={self.microbatches} v={self.chunks}",
            f"costs: {origin}",
            f"{'':24}{'measured':>14}{'simulated':>14}{'error':>10}",
            f"{'step time (median)':24}{ms(self.step_time_measured):>14}{ms(self.step_time_simulated):>14}"
            f"{100 * self.step_time_error:>+9.1f}%   (measured spread, IQR / median: "
            f"{100 * self.step_time_spread:.1f}%; the median's 95% interval {100 * self.step_time_interval[0]:+.1f}% "
            f"to {100 * self.step_time_interval[1]:+.1f}%)",
            f"{'step-time spread':24}{100 * self.step_time_spread:>13.1f}%{100 * self.step_time_spread_simulated:>13.1f}%"
            "   (IQR / median; simulated: over the spread's draws, none without one)",
            f"{'makespan (median)':24}{ms(self.makespan_measured):>14}{ms(self.makespan_simulated):>14}"
            f"{100 * self.makespan_error:>+9.1f}%",
            f"{'bubble ratio':24}{100 * self.bubble_ratio_measured:>13.1f}%{100 * self.bubble_ratio_simulated:>13.1f}%",
            f"start-time MAE: {100 * self.start_mae:.1f}% of the measured makespan",
            f"{'compute per step':24}{ms(self.compute_measured):>14}{ms(self.compute_simulated):>14}"
            f"{100 * _relative(self.compute_simulated, self.compute_measured):>+9.1f}%   (summed over ranks, each "
            "action on a core of its own)",
            f"at the run's compute level (costs x{self.compute_level:.3f}): step time "
            f"{ms(self.step_time_at_run_level)}, {100 * self.step_time_error_at_run_level:+.1f}%",
        ]
        for rank, (m, s) in enumerate(zip(self.peak_activation_bytes_measured, self.peak_activation_bytes_simulated)):
            lines.append(f"{f'peak activation, rank {rank}':24}{m:>12,} B{s:>12,} B")
        return "\n".join(lines)


def compare_run(run: MeasuredRun, costs: CostModel, dispatch: float = 0.0) -> tuple[Comparison, SimResult]:
    """Simulate a checked `run`'s program under `costs` and compare (CostError if they do not fit);
    `dispatch`: seconds of the executor's loop that `costs` hold per compute action (module
    docstring, ``compute_measured``)."""
    result = simulate(run.program, costs)
    metrics = run.step_metrics()
    makespan = float(metrics["makespan"].median())
    step_time = run.step_time_median
    schedule = run.program.schedule
    compute = compute_level(run, costs, dispatch)
    level = compute.level
    at_level = float("nan") if math.isnan(level) else simulate(run.program, costs.compute_scaled(level)).step_time
    comparison = Comparison(
        run=str(run.path),
        schedule=schedule.name,
        ranks=schedule.ranks,
        microbatches=schedule.microbatches,
        chunks=schedule.chunks,
        step_time_measured=step_time,
        step_time_simulated=result.step_time,
        step_time_error=_relative(result.step_time, step_time),
        makespan_measured=makespan,
        makespan_simulated=result.makespan,
        makespan_error=_relative(result.makespan, makespan),
        start_mae=start_mae(run, result) / makespan if makespan > 0 else 0.0,
        bubble_ratio_measured=float(metrics["bubble_ratio"].median()),
        bubble_ratio_simulated=result.bubble_ratio,
        peak_activation_bytes_measured=[int(b) for b in run.summary["peak_activation_bytes"]],
        peak_activation_bytes_simulated=result.peak_activation_bytes,
        step_time_spread=step_spread(run.step_times),
        step_time_interval=median_interval(run.step_times),
        step_time_spread_simulated=result.step_time_spread,
        compute_measured=compute.measured,
        compute_simulated=compute.simulated,
        compute_level=level,
        step_time_at_run_level=at_level,
        step_time_error_at_run_level=_relative(at_level, step_time),
    )
    return comparison, result


class ComputeLevel(NamedTuple):
    """A run's compute per step beside a cost model's for its program (module docstring)."""

    measured: float
    simulated: float

    @property
    def level(self) -> float:
        """measured / simulated; NaN where either is not positive (nothing to compare)."""
        return self.measured / self.simulated if self.measured > 0 and self.simulated > 0 else float("nan")


def compute_level(run: MeasuredRun, costs: CostModel, dispatch: float = 0.0) -> ComputeLevel:
    """The run's compute per step (`measured_compute`) and `costs`' for its program
    (`sim.engine.compute_seconds`)."""
    return ComputeLevel(measured_compute(run, dispatch, costs.idle_share), compute_seconds(run.program, costs))


def measured_compute(run: MeasuredRun, dispatch: float = 0.0, idle: float | None = None) -> float:
    """The run's compute in a step, seconds: summed over ranks, each compute row on a processor
    of its own plus `dispatch`, mean over steps (module docstring, ``compute_measured``): the
    calibration's typical costs are means over steps, and the spreads draw the steps' variation
    around them, so a median here put a run at x0.94 of its own calibration; where the ranks
    shared cores, a rank not computing taking `idle` of one (the cost model's, so that the level
    and the simulation share one law; default: the run's own fit). Steps the machine stalled
    are left out (`typical_steps`), as every fit leaves them out: kept in, a run with three such
    steps among 48 stood at x1.013 of its own calibration."""
    frame = compute_frame(typical_steps(run), idle)
    if not len(frame):
        return 0.0
    return float((frame["duration"] + dispatch).groupby(frame["step"]).sum().mean())


MEDIAN_CONFIDENCE = 0.95


def median_interval(times: list[float]) -> tuple[float, float]:
    """A distribution-free MEDIAN_CONFIDENCE interval of the median of the step times, relative
    to their median (-0.05, +0.04 is 5% below to 4% above; (0, 0) without steps): the j-th
    smallest and j-th largest time, j the largest rank with P(Binom(n, 1/2) < j) <= (1 -
    MEDIAN_CONFIDENCE) / 2 (at least 1: under 6 steps the interval is the whole range and covers
    less). It takes the steps as independent draws; a run whose speed drifts from step to step
    has a wider true interval."""
    n = len(times)
    if not n:
        return 0.0, 0.0
    tail = (1 - MEDIAN_CONFIDENCE) / 2
    j, below = 1, 0.0
    while j < n and below + math.comb(n, j - 1) / 2 ** n <= tail:  # P(X <= j - 1) still within the tail
        below += math.comb(n, j - 1) / 2 ** n
        j += 1
    j = max(j - 1, 1)
    ordered = sorted(times)
    mid = float(np.median(ordered))
    if not mid:
        return 0.0, 0.0
    return ordered[j - 1] / mid - 1, ordered[n - j] / mid - 1


def start_mae(run: MeasuredRun, result: SimResult) -> float:
    """Mean |simulated - measured| start over every action of every measured step, seconds."""
    simulated = result.timeline.set_index(["rank", "action"])["start"]
    measured = run.timeline.set_index(["rank", "action"])["start"]
    paired = simulated.reindex(measured.index).to_numpy()
    return float(np.mean(np.abs(paired - measured.to_numpy())))


def _relative(simulated: float, measured: float) -> float:
    return (simulated - measured) / measured if measured else float("nan")
