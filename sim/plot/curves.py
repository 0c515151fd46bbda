"""Activation memory per rank over time on one Axes, with each rank's peak marked."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.ticker import MaxNLocator

from .style import rank_colour
from .units import byte_unit, memory_steps


def memory_unit(step_memory: pd.DataFrame, unit_bytes: float | None, unit_label: str | None) -> tuple[str, float]:
    """(axis label, divisor): `unit_bytes` per unit when given, else a binary prefix of bytes."""
    if unit_bytes is not None:
        if unit_bytes <= 0:
            raise ValueError(f"unit_bytes must be positive; got {unit_bytes}")
        return unit_label or f"x {unit_bytes:g} bytes", float(unit_bytes)
    peak = float(step_memory["bytes"].max()) if len(step_memory) else 0.0
    return byte_unit(peak)


def draw_memory(
    ax,
    step_memory: pd.DataFrame,
    *,
    ranks: int,
    xmax: float,
    scale: float,
    unit: str,
    unit_bytes: float | None = None,
    unit_label: str | None = None,
    legend: bool = True,
    ylabel: bool = True,
) -> tuple[list[float], float]:
    """Step curves of activation bytes held per rank, peaks marked.

    Returns each rank's peak in bytes and the highest peak in axis units.
    """
    label, divisor = memory_unit(step_memory, unit_bytes, unit_label)
    segments, colours, peaks = [], [], []
    peak_x, peak_y, peak_c = [], [], []
    for rank in range(ranks):
        x, y = memory_steps(step_memory, rank, until=xmax / scale)
        segments.append(np.column_stack([x * scale, y / divisor]))
        colour = rank_colour(rank, ranks)
        colours.append(colour)
        # The peak is taken over every recorded change, including same-instant ones the curve merges.
        held = step_memory[step_memory["rank"] == rank]
        peak = float(held["bytes"].max()) if len(held) else 0.0
        first = held.loc[held["bytes"] == peak, "time"].min() if len(held) else 0.0
        peaks.append(peak)
        peak_x.append(first * scale)
        peak_y.append(peak / divisor)
        peak_c.append(colour)
    ax.add_collection(LineCollection(segments, colors=colours, linewidths=1.4 if ranks <= 8 else 0.8))
    ax.scatter(peak_x, peak_y, c=peak_c, s=22 if ranks <= 8 else 8, zorder=3, edgecolors="white", linewidths=0.5)
    ymax = max(peak_y) if peak_y else 1.0
    ax.set_xlim(0.0, xmax)
    ax.set_ylim(0.0, (ymax if ymax > 0 else 1.0) * 1.18)
    ax.set_xlabel(f"time ({unit})")
    if ylabel:
        ax.set_ylabel(f"activations\n({label})")
    top_rank = int(np.argmax(peaks)) if peaks else 0
    ax.annotate(
        f"peak {peak_y[top_rank]:.3g} (rank {top_rank})",
        (peak_x[top_rank], peak_y[top_rank]), xytext=(4, 4), textcoords="offset points", fontsize=7,
    )
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    if legend and ranks <= 8:
        ax.legend(rank_handles(ranks), [f"rank {r}" for r in range(ranks)],
                  fontsize=7, frameon=False, ncol=min(ranks, 4), loc="upper right")
    return peaks, ymax


def rank_handles(ranks: int) -> list:
    """Legend lines for the rank colours of a memory plot."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color=rank_colour(r, ranks), label=f"rank {r}") for r in range(ranks)]
