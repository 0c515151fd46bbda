"""What every figure shares: its width, a Gantt panel's height, the step it shows, its title, saving it.

Every figure function of sim/plot/ takes tables in the `schedules.timeline` schema
(simulated or measured), picks one step (`step`, else the median-makespan step after
`warmup`: sim.metrics.select_step), returns a matplotlib Figure and writes it to `path`
if given. Figures are built without pyplot, so nothing global changes and no display is
needed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from schedules.timeline import check_timeline

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


def save(fig: Figure, path, dpi: int) -> Figure:
    """Write `fig` to exactly `path` when one is given (format from its extension, PNG if it has
    none: matplotlib alone would append ".png" to the name); returns it. ValueError for an
    extension matplotlib cannot write."""
    if path is not None:
        fig.savefig(path, dpi=dpi, format=image_format(path, fig))
    return fig


def image_format(path, fig: Figure | None = None) -> str:
    """The image format `path` asks for: its extension (lower case), or "png" if it has none."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    supported = (fig or Figure()).canvas.get_supported_filetypes()
    if suffix not in supported:
        raise ValueError(f"cannot write {path}: unknown image format .{suffix} (known: {', '.join(sorted(supported))})")
    return suffix
