"""Measured and simulated timelines of one run on one time axis, paired rows per rank."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..metrics import step_summary
from .figure import WIDTH_IN, median_step, rows_height, save, step_of
from .gantt import Lane, add_legend, draw_compute, legend_handles, setup_rank_axis
from .units import time_unit

MEASURED_LANE = Lane(0.06, 0.48)
SIMULATED_LANE = Lane(0.52, 0.94)


def plot_overlay(
    measured_timeline: pd.DataFrame,
    simulated_timeline: pd.DataFrame,
    *,
    name: str = "",
    step: int | None = None,
    warmup: int = 0,
    path=None,
    dpi: int = 150,
) -> Figure:
    """Measured and simulated timelines of one run on one time axis, paired rows per rank.

    Each rank has two rows: the measurement (solid) above the simulation (hatched); the title
    gives both makespans and the signed relative error (simulated - measured) / measured;
    lines mark both makespans. The measurement is `step` when given, else the median step:
    each action's median start and end over the steps after `warmup`.
    """
    if step is None:
        kept, measured = median_step(measured_timeline, warmup)
        which = f"median of {kept} steps" if kept > 1 else "its one step"
    else:
        chosen, measured = step_of(measured_timeline, step, warmup, "measured timeline")
        which = f"step {chosen}"
    _, simulated = step_of(simulated_timeline, None, 0, "simulated timeline")
    m_sum, s_sum = step_summary(measured), step_summary(simulated)
    ranks = max(m_sum.ranks, s_sum.ranks)
    chunks = max(m_sum.chunks, s_sum.chunks)
    span = max(m_sum.makespan, s_sum.makespan)
    unit, scale = time_unit(span)
    fig = Figure(figsize=(WIDTH_IN, rows_height(ranks) * 1.5 + 1.1), layout="constrained")
    ax = fig.subplots()
    setup_rank_axis(ax, ranks, span * scale, unit)
    if ranks <= 16:  # name both halves of every row
        ax.set_yticks([r + lane_mid for r in range(ranks) for lane_mid in
                       ((MEASURED_LANE.top + MEASURED_LANE.bottom) / 2, (SIMULATED_LANE.top + SIMULATED_LANE.bottom) / 2)])
        ax.set_yticklabels([text for r in range(ranks) for text in (f"rank {r} measured", "simulated")])
        ax.tick_params(axis="y", labelsize=7)
    draw_compute(ax, measured, scale=scale, chunks=chunks, lane=MEASURED_LANE)
    draw_compute(ax, simulated, scale=scale, chunks=chunks, lane=SIMULATED_LANE, alpha=0.55, hatch="////")
    for makespan, style in ((m_sum.makespan, "-"), (s_sum.makespan, ":")):
        ax.vlines(makespan * scale, 0, ranks, colors="#333333", linestyles=style,
                  linewidth=0.8, zorder=1)  # behind the boxes: seen in the gaps
    error = (s_sum.makespan - m_sum.makespan) / m_sum.makespan if m_sum.makespan > 0 else float("nan")
    head = f"{name}  ·  " if name else ""
    ax.set_title(
        f"{head}{which}  ·  makespan measured {m_sum.makespan * scale:.4g} {unit}, "
        f"simulated {s_sum.makespan * scale:.4g} {unit}  ·  error {100 * error:+.1f}%\n"
        f"bubble measured {100 * m_sum.bubble_ratio:.1f}%, simulated {100 * s_sum.bubble_ratio:.1f}%",
        fontsize=9,
    )
    handles = legend_handles(set(measured["kind"]) | set(simulated["kind"]), chunks)
    handles += [Patch(facecolor="#888888", label="measured (upper row of a rank)"),
                Patch(facecolor="#888888", alpha=0.55, hatch="////", label="simulated (lower row)"),
                Line2D([], [], color="#333333", linewidth=0.8, label="measured makespan"),
                Line2D([], [], color="#333333", linewidth=0.8, linestyle=":", label="simulated makespan")]
    add_legend(fig, handles)
    return save(fig, path, dpi)
