"""What every figure shares: its width, a Gantt panel's height, the step it shows, its title, saving it.

Every figure function of sim/plot/ takes tables in the `schedules.timeline` schema
(simulated or measured), picks one step (`step`, else the median-makespan step after
`warmup`: sim.metrics.select_step), returns a matplotlib Figure and writes it to `path`
if given. Figures are built without pyplot, so nothing global changes and no display is
needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from schedules import ScheduleError
from schedules.timeline import check_timeline, step_makespans

from ..metrics import StepSummary, one_step, select_step

WIDTH_IN = 8.0  # README column width at 100 px per inch


def rows_height(ranks: int, per_row: float = 0.32) -> float:
    """Height in inches of a Gantt panel with `ranks` rows: roomy for a few, compressed for many."""
    if ranks <= 8:
        return 0.45 + per_row * ranks
    return min(3.0 + 0.09 * (ranks - 8), 9.0)


def panel_title(name: str, summary: StepSummary, step: int | None = None) -> str:
    """A panel's headline: name, sizes, bubble ratio (and the measured step shown)."""
    parts = [name] if name else []
    parts.append(f"p={summary.ranks}, m={summary.microbatches}, v={summary.chunks}")
    parts.append(f"bubble {100 * summary.bubble_ratio:.1f}% (rank span {100 * summary.bubble_ratio_rank_span:.1f}%)")
    if step is not None:
        parts.append(f"step {step}")
    return "  ·  ".join(parts)


def step_of(timeline: pd.DataFrame, step: int | None, warmup: int, what: str) -> tuple[int, pd.DataFrame]:
    """The step to show (sim.metrics.select_step) and its rows; ScheduleError naming `what`."""
    check_timeline(timeline, what)
    chosen = select_step(timeline, step, warmup)
    return chosen, one_step(timeline, chosen)


def median_step(timeline: pd.DataFrame, warmup: int = 0) -> tuple[int, pd.DataFrame]:
    """How many steps were kept and one step made of them: each action's median start and median
    end over the steps after `warmup` (what an overlay compares a one-step simulation with;
    one step would be one draw of the noise). ScheduleError if `warmup` leaves no step."""
    check_timeline(timeline, "measured timeline")
    steps = sorted(timeline["step"].unique())
    if warmup < 0 or warmup >= len(steps):
        raise ScheduleError(f"warmup={warmup} leaves none of the {len(steps)} step(s) of the timeline")
    kept = timeline[timeline["step"].isin(steps[warmup:])]
    keys = ["rank", "action"]
    times = kept.groupby(keys, sort=False)[["start", "end"]].median()
    first = kept[kept["step"] == steps[warmup]].drop(columns=["start", "end"])
    frame = first.join(times, on=keys)[list(timeline.columns)]
    return len(steps) - warmup, frame.assign(step=0).reset_index(drop=True)


def steps_back_to_back(timeline: pd.DataFrame, memory: pd.DataFrame | None, warmup: int = 0):
    """Every step after `warmup` laid one after another as one step (step 0): each step's times
    shifted by the makespans of the steps before it (every rank starts a step at 0), memory
    likewise. Returns (steps kept, timeline, memory or None)."""
    check_timeline(timeline, "measured timeline")
    spans = step_makespans(timeline)
    if warmup < 0 or warmup >= len(spans):
        raise ScheduleError(f"warmup={warmup} leaves none of the {len(spans)} step(s) of the timeline")
    spans = spans.iloc[warmup:]
    offsets = spans.cumsum() - spans

    def shifted(table: pd.DataFrame, columns: tuple[str, ...]) -> pd.DataFrame:
        table = table[table["step"].isin(spans.index)].copy()
        shift = table["step"].map(offsets)
        for column in columns:
            table[column] = table[column] + shift
        return table.assign(step=0).reset_index(drop=True)

    return (len(spans), shifted(timeline, ("start", "end")),
            None if memory is None else shifted(memory, ("time",)))


def save(fig: Figure, path, dpi: int) -> Figure:
    """Write `fig` to exactly `path` when one is given (format from its extension, PNG if it has
    none: matplotlib alone would append ".png" to the name); returns it. ValueError for an
    extension matplotlib cannot write."""
    if path is not None:
        fig.savefig(path, dpi=dpi, format=image_format(path, fig))
    return fig


def image_format(path, fig: Figure | None = None) -> str:
    """The image format `path` asks for: its extension (lower case), or "png" if it has none
    (or if it is a file object)."""
    if not isinstance(path, (str, os.PathLike)):
        return "png"
    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    supported = (fig or Figure()).canvas.get_supported_filetypes()
    if suffix not in supported:
        raise ValueError(f"cannot write {path}: unknown image format .{suffix} (known: {', '.join(sorted(supported))})")
    return suffix
