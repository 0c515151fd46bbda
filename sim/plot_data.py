"""What the plots read off a timeline table: one step, its sizes, makespan and bubble ratio.

Works on any table in the `schedules.timeline` schema, simulated (one step, 0) or
measured (steps 0..n-1); every function here takes the whole table or one step of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from schedules import ScheduleError
from schedules.timeline import TIMELINE_COLUMNS, bubble_ratio_rank_span, missing_columns

COMPUTE_KINDS = ("F", "B", "I", "W")
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


def check_timeline(timeline: pd.DataFrame, what: str = "timeline") -> None:
    """Raise ScheduleError unless `timeline` has the schema's columns and at least one row."""
    missing = missing_columns(timeline.columns, TIMELINE_COLUMNS)
    if missing:
        raise ScheduleError(f"{what} is not a timeline table: missing columns {', '.join(missing)}")
    if len(timeline) == 0:
        raise ScheduleError(f"{what} has no rows")


def step_makespans(timeline: pd.DataFrame) -> pd.Series:
    """Makespan of every step (latest end of any action), indexed by step."""
    return timeline.groupby("step")["end"].max().sort_index()


def select_step(timeline: pd.DataFrame, step: int | None = None, warmup: int = 0) -> int:
    """The step to plot: `step` if given, else the median-makespan step after `warmup` steps.

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


def summarize(step_timeline: pd.DataFrame, ranks: int | None = None) -> StepSummary:
    """Sizes (p, m, v), makespan and bubble ratio of one step's timeline.

    bubble ratio = idle compute time / (p * makespan), the GPipe / zero-bubble definition,
    with makespan the latest end of any action and busy time the summed compute durations;
    bubble_ratio_rank_span is the zero-bubble paper's rate over the longest rank span.
    """
    check_timeline(step_timeline)
    p = int(step_timeline["rank"].max()) + 1 if ranks is None else ranks
    compute = step_timeline[step_timeline["kind"].isin(COMPUTE_KINDS)]
    makespan = float(step_timeline["end"].max())
    busy = float((compute["end"] - compute["start"]).sum())
    bubble = 1.0 - busy / (p * makespan) if makespan > 0 else 0.0
    by_rank = compute.groupby("rank")
    spans = (by_rank["end"].max() - by_rank["start"].min()).tolist()
    busy_per_rank = (compute["end"] - compute["start"]).groupby(compute["rank"]).sum().tolist()
    return StepSummary(
        ranks=p,
        microbatches=int(step_timeline["microbatch"].max()) + 1,
        chunks=int(step_timeline["chunk"].max()) + 1,
        makespan=makespan,
        bubble_ratio=bubble,
        bubble_ratio_rank_span=bubble_ratio_rank_span(spans, busy_per_rank),
    )


def time_unit(span_seconds: float) -> tuple[str, float]:
    """A readable unit for an axis spanning `span_seconds`: (label, factor to multiply seconds by)."""
    for label, factor in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if span_seconds * factor >= 1.0:
            return label, factor
    return "ns", 1e9


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """A binary-prefixed unit for a memory axis reaching `max_bytes`: (label, divisor)."""
    for label, divisor in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if max_bytes >= divisor:
            return label, divisor
    return "bytes", 1.0


def memory_steps(memory: pd.DataFrame, rank: int, until: float) -> tuple[np.ndarray, np.ndarray]:
    """A rank's memory curve as step-function vertices (x, y), held until `until`."""
    rows = memory[memory["rank"] == rank].sort_values("time", kind="stable")
    # Several changes at one instant (a B frees as the next F allocates) would draw as a
    # zero-width spike: keep the value held after the last of them.
    rows = rows.groupby("time", sort=True, as_index=False).last()
    t = rows["time"].to_numpy(dtype=float)
    b = rows["bytes"].to_numpy(dtype=float)
    if t.size == 0:
        return np.array([0.0, until]), np.array([0.0, 0.0])
    x = np.repeat(np.append(t, max(until, t[-1])), 2)[1:-1]
    y = np.repeat(b, 2)
    if t[0] > 0:  # nothing held before the first change
        x = np.concatenate(([0.0, t[0]], x))
        y = np.concatenate(([0.0, 0.0], y))
    return x, y
