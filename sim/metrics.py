"""What a timeline table says about its steps: which step to show, a step's sizes and headline
numbers, and how much step times spread.

Works on any table in the `schedules.timeline` schema, simulated (one step, 0) or
measured (steps 0..n-1). The metrics themselves (makespan, bubble ratios) are defined
in schedules.timeline, for the simulator and the executor alike, as is the check that
a table is one (`check_timeline`); this module picks a step and reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from schedules import ScheduleError
from schedules.timeline import check_timeline, step_makespans, step_metrics


def select_step(timeline: pd.DataFrame, step: int | None = None, warmup: int = 0) -> int:
    """The step to show: `step` if given, else the median-makespan step after `warmup` steps.

    The executor does not record its warm-up steps (summary.json's ``warmup`` counts them),
    so a run's table needs no skipping by default; pass `warmup` for tables that hold them.
    With an even count the lower median is taken, so the answer is always a step that ran.
    """
    check_timeline(timeline)
    spans = step_makespans(timeline)
    if step is not None:
        if step not in spans.index:
            raise ScheduleError(f"step {step} is not in the timeline (steps {spans.index.min()}..{spans.index.max()})")
        return int(step)
    if warmup < 0:
        raise ScheduleError(f"warmup must be >= 0; got {warmup}")
    kept = spans.iloc[warmup:]
    if kept.empty:
        raise ScheduleError(f"warmup={warmup} skips all {len(spans)} step(s) of the timeline")
    ordered = kept.sort_values(kind="stable")
    return int(ordered.index[(len(ordered) - 1) // 2])


def one_step(table: pd.DataFrame, step: int) -> pd.DataFrame:
    """Rows of a timeline or memory table that belong to `step`."""
    return table[table["step"] == step]


@dataclass(frozen=True)
class StepSummary:
    """Sizes and headline numbers of one step of a timeline."""

    ranks: int
    microbatches: int
    chunks: int
    makespan: float
    bubble_ratio: float
    bubble_ratio_rank_span: float  # the zero-bubble paper's rate, schedules.timeline


def step_summary(step_timeline: pd.DataFrame, ranks: int | None = None) -> StepSummary:
    """Sizes (p, m, v), makespan and bubble ratio of one step's timeline (p: the highest
    rank plus one unless given; metrics: schedules.timeline.step_metrics)."""
    check_timeline(step_timeline)
    p = int(step_timeline["rank"].max()) + 1 if ranks is None else ranks
    (metrics,) = step_metrics(step_timeline, p).itertuples(index=False)
    return StepSummary(
        ranks=p,
        microbatches=int(step_timeline["microbatch"].max()) + 1,
        chunks=int(step_timeline["chunk"].max()) + 1,
        makespan=float(metrics.makespan),
        bubble_ratio=float(metrics.bubble_ratio),
        bubble_ratio_rank_span=float(metrics.bubble_ratio_rank_span),
    )


def step_spread(times: Sequence[float]) -> float:
    """Interquartile range of step times over their median (0 without steps): how much a run's
    steps vary, measured or drawn by the simulator (sim.result.SimResult.step_time_spread)."""
    if not len(times):
        return 0.0
    q1, mid, q3 = np.percentile(times, [25, 50, 75])
    return float((q3 - q1) / mid) if mid else 0.0
