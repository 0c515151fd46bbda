"""Figures from timeline and memory tables: one schedule, a comparison, memory, sim vs measured.

Every function takes tables in the `schedules.timeline` schema (simulated or measured),
picks one step (`step`, else the median-makespan step after `warmup`, see
`plot_data.select_step`), returns a matplotlib Figure and writes it to `path` if given.
Figures are built without pyplot, so nothing global changes and no display is needed.
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd
from matplotlib.figure import Figure

from schedules import ScheduleError

from .plot_data import check_timeline, one_step, select_step, summarize, time_unit
from .plot_gantt import (
    Lane, add_legend, draw_compute, draw_gantt, legend_handles, setup_rank_axis,
)
from .plot_memory import draw_memory, memory_unit, rank_handles

WIDTH_IN = 8.0  # README column width at 100 px per inch


def rows_height(ranks: int, per_row: float = 0.32) -> float:
    """Height in inches of a Gantt panel with `ranks` rows: roomy for a few, compressed for many."""
    if ranks <= 8:
        return 0.45 + per_row * ranks
    return min(3.0 + 0.09 * (ranks - 8), 9.0)


def _title(name: str, summary, step: int | None = None) -> str:
    parts = [name] if name else []
    parts.append(f"p={summary.ranks}, m={summary.microbatches}, v={summary.chunks}")
    parts.append(f"bubble {100 * summary.bubble_ratio:.1f}% (rank span {100 * summary.bubble_ratio_rank_span:.1f}%)")
    if step is not None:
        parts.append(f"step {step}")
    return "  ·  ".join(parts)


def _step_of(timeline: pd.DataFrame, step: int | None, warmup: int, what: str) -> tuple[int, pd.DataFrame]:
    check_timeline(timeline, what)
    chosen = select_step(timeline, step, warmup)
    return chosen, one_step(timeline, chosen)


def _save(fig: Figure, path, dpi: int) -> Figure:
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def plot_timeline(
    timeline: pd.DataFrame,
    memory: pd.DataFrame | None = None,
    *,
    name: str = "",
    step: int | None = None,
    warmup: int = 0,
    comm: bool = False,
    unit_bytes: float | None = None,
    unit_label: str | None = None,
    note: str | None = None,
    path=None,
    dpi: int = 150,
) -> Figure:
    """Gantt chart of one step (and its memory curves under it when `memory` is given)."""
    chosen, frame = _step_of(timeline, step, warmup, "timeline")
    summary = summarize(frame)
    unit, scale = time_unit(summary.makespan)
    xmax = summary.makespan * scale
    heights = [rows_height(summary.ranks) + (0.3 if comm else 0.0)]
    if memory is not None:
        heights.append(1.8)
    fig = Figure(figsize=(WIDTH_IN, sum(heights) + 1.0), layout="constrained")
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    draw_gantt(axes[0], frame, ranks=summary.ranks, chunks=summary.chunks, xmax=xmax, unit=unit, scale=scale, comm=comm)
    measured_step = chosen if frame["source"].eq("measured").any() else None
    title = _title(name, summary, measured_step)
    if note:  # the headline on top, the details under it
        fig.suptitle(title, fontsize=10)
        axes[0].set_title(note, fontsize=8, color="#444444")
    else:
        axes[0].set_title(title, fontsize=10)
    handles = legend_handles(set(frame["kind"]), summary.chunks, comm)
    if memory is not None:
        axes[0].set_xlabel("")
        draw_memory(
            axes[1], one_step(memory, chosen), ranks=summary.ranks, xmax=xmax, scale=scale, unit=unit,
            unit_bytes=unit_bytes, unit_label=unit_label, legend=False,
        )
        if summary.ranks <= 8:
            handles += rank_handles(summary.ranks)
    add_legend(fig, handles)
    return _save(fig, path, dpi)


def plot_compare(
    timelines: Mapping[str, pd.DataFrame],
    *,
    memories: Mapping[str, pd.DataFrame] | None = None,
    unit_bytes: Mapping[str, float] | None = None,
    unit_label: str | None = None,
    comm: bool = False,
    note: str | None = None,
    path=None,
    dpi: int = 150,
) -> Figure:
    """One Gantt panel per named timeline, stacked on a shared time axis.

    With `memories`, each Gantt panel gets that schedule's memory curves under it, in units
    of `unit_bytes[name]` (named `unit_label`) when given, else bytes.
    """
    if not timelines:
        raise ScheduleError("nothing to compare: no timelines given")
    chosen = {label: _step_of(t, None, 0, f"timeline {label!r}") for label, t in timelines.items()}
    summaries = {label: summarize(frame) for label, (_, frame) in chosen.items()}
    span = max(s.makespan for s in summaries.values())
    unit, scale = time_unit(span)
    heights = []
    per_row = 0.32 if len(timelines) <= 3 else 0.25  # many panels: shorter rows, still room for labels
    for summary in summaries.values():
        heights.append(rows_height(summary.ranks, per_row) + (0.3 if comm else 0.0))
        if memories is not None:
            heights.append(1.3)
    fig = Figure(figsize=(WIDTH_IN, sum(heights) + 0.35 * len(heights) + 1.2), layout="constrained")
    axes = list(fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0])
    kinds: set[str] = set()
    chunks = 1
    for label, (step, frame) in chosen.items():
        summary = summaries[label]
        ax = axes.pop(0)
        draw_gantt(ax, frame, ranks=summary.ranks, chunks=summary.chunks, xmax=span * scale, unit=unit,
                   scale=scale, comm=comm)
        ax.set_title(_title(label, summary), fontsize=9, loc="left")
        ax.set_xlabel("")
        kinds |= set(frame["kind"])
        chunks = max(chunks, summary.chunks)
        if memories is not None:
            if label not in memories:
                raise ScheduleError(f"no memory table for {label!r}")
            ax = axes.pop(0)
            draw_memory(
                ax, one_step(memories[label], step), ranks=summary.ranks, xmax=span * scale, scale=scale,
                unit=unit, unit_bytes=None if unit_bytes is None else unit_bytes[label], unit_label=unit_label,
                legend=False,
            )
            ax.set_xlabel("")
    fig.axes[-1].set_xlabel(f"time ({unit})")
    if note:
        fig.suptitle(note, fontsize=9)
    handles = legend_handles(kinds, chunks, comm)
    if memories is not None and max(s.ranks for s in summaries.values()) <= 8:
        handles += rank_handles(max(s.ranks for s in summaries.values()))
    add_legend(fig, handles)
    return _save(fig, path, dpi)


def plot_memory(
    memories: Mapping[str, pd.DataFrame],
    timelines: Mapping[str, pd.DataFrame],
    *,
    unit_bytes: Mapping[str, float] | None = None,
    unit_label: str | None = None,
    note: str | None = None,
    path=None,
    dpi: int = 150,
) -> Figure:
    """Activation memory per rank over time, one panel per name, shared time and memory axes.

    `timelines[name]` gives the step and its makespan (the curves are held until it ends);
    `unit_bytes[name]`, when given, is the memory unit of that panel (e.g. one microbatch's
    activations of one rank's share), named `unit_label`.
    """
    if not memories:
        raise ScheduleError("no memory tables given")
    missing = [label for label in memories if label not in timelines]
    if missing:
        raise ScheduleError(f"no timeline for memory table(s) {', '.join(missing)}")
    chosen = {label: _step_of(timelines[label], None, 0, f"timeline {label!r}") for label in memories}
    summaries = {label: summarize(frame) for label, (_, frame) in chosen.items()}
    span = max(s.makespan for s in summaries.values())
    unit, scale = time_unit(span)
    fig = Figure(figsize=(WIDTH_IN, 1.5 * len(memories) + 1.0), layout="constrained")
    axes = fig.subplots(len(memories), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    top, ranks = 0.0, 1
    for ax, (label, memory) in zip(axes, memories.items()):
        step, _ = chosen[label]
        summary = summaries[label]
        _, peak = draw_memory(
            ax, one_step(memory, step), ranks=summary.ranks, xmax=span * scale, scale=scale, unit=unit,
            unit_bytes=None if unit_bytes is None else unit_bytes[label], unit_label=unit_label,
            legend=False, ylabel=False,
        )
        top, ranks = max(top, peak), max(ranks, summary.ranks)
        ax.set_title(f"{label}  ·  p={summary.ranks}, m={summary.microbatches}, v={summary.chunks}",
                     fontsize=9, loc="left")
        if ax is not axes[-1]:
            ax.set_xlabel("")
    axes[0].set_ylim(0.0, (top if top > 0 else 1.0) * 1.25)
    if unit_bytes is not None:
        label = unit_label or "panel units"
    else:
        label = memory_unit(pd.concat(list(memories.values())), None, None)[0]
    fig.supylabel(f"activations held ({label})", fontsize=9)
    if note:
        fig.suptitle(note, fontsize=9)
    if ranks <= 8:
        add_legend(fig, rank_handles(ranks))
    return _save(fig, path, dpi)


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

    Each rank's row holds the measured step (upper half, solid) and the simulation (lower
    half, hatched); the title gives both makespans and the signed relative error
    (simulated - measured) / measured. `step`/`warmup` select the measured step.
    """
    chosen, measured = _step_of(measured_timeline, step, warmup, "measured timeline")
    _, simulated = _step_of(simulated_timeline, None, 0, "simulated timeline")
    m_sum, s_sum = summarize(measured), summarize(simulated)
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
    for makespan, lane in ((m_sum.makespan, MEASURED_LANE), (s_sum.makespan, SIMULATED_LANE)):
        ax.vlines(makespan * scale, 0, ranks, colors="#333333", linestyles=":" if lane is SIMULATED_LANE else "-",
                  linewidth=0.8, zorder=1)  # behind the boxes: seen in the gaps
    error = (s_sum.makespan - m_sum.makespan) / m_sum.makespan if m_sum.makespan > 0 else float("nan")
    head = f"{name}  ·  " if name else ""
    ax.set_title(
        f"{head}step {chosen}  ·  makespan measured {m_sum.makespan * scale:.4g} {unit}, "
        f"simulated {s_sum.makespan * scale:.4g} {unit}  ·  error {100 * error:+.1f}%\n"
        f"bubble measured {100 * m_sum.bubble_ratio:.1f}%, simulated {100 * s_sum.bubble_ratio:.1f}%",
        fontsize=9,
    )
    from matplotlib.patches import Patch

    handles = legend_handles(set(measured["kind"]) | set(simulated["kind"]), chunks)
    handles += [Patch(facecolor="#888888", label="measured (upper half)"),
                Patch(facecolor="#888888", alpha=0.55, hatch="////", label="simulated (lower half)")]
    add_legend(fig, handles)
    return _save(fig, path, dpi)


__all__ = ["plot_compare", "plot_memory", "plot_overlay", "plot_timeline", "rows_height"]
