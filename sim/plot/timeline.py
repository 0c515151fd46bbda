"""Gantt figures: one schedule's step (with its memory curves under it), or several stacked on one time axis."""

from __future__ import annotations

from typing import Mapping

import pandas as pd
from matplotlib.figure import Figure

from schedules import ScheduleError

from ..metrics import one_step, step_summary
from .figure import WIDTH_IN, panel_title, rows_height, save, step_of
from .gantt import add_legend, draw_gantt, legend_handles
from .curves import draw_memory, memory_unit, rank_handles
from .units import time_unit


MAX_HEIGHT_IN = 16.0  # a comparison's height cap: 2400 px at 150 dpi


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
    show_step: bool = True,
) -> Figure:
    """Gantt chart of one step (and its memory curves under it when `memory` is given); a
    measured step's number is in the title unless `show_step` is False (steps laid back to
    back as one, sim.plot.figure.steps_back_to_back)."""
    chosen, frame = step_of(timeline, step, warmup, "timeline")
    summary = step_summary(frame)
    unit, scale = time_unit(summary.makespan)
    xmax = summary.makespan * scale
    heights = [rows_height(summary.ranks) + (0.3 if comm else 0.0)]
    if memory is not None:
        heights.append(1.8)
    fig = Figure(figsize=(WIDTH_IN, sum(heights) + 1.0), layout="constrained")
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0]
    draw_gantt(axes[0], frame, ranks=summary.ranks, chunks=summary.chunks, xmax=xmax, unit=unit, scale=scale, comm=comm)
    measured_step = chosen if show_step and frame["source"].eq("measured").any() else None
    title = panel_title(name, summary, measured_step)
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
    return save(fig, path, dpi)


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
    chosen = {label: step_of(t, None, 0, f"timeline {label!r}") for label, t in timelines.items()}
    summaries = {label: step_summary(frame) for label, (_, frame) in chosen.items()}
    span = max(s.makespan for s in summaries.values())
    unit, scale = time_unit(span)
    heights = []
    per_row = 0.32 if len(timelines) <= 3 else 0.25  # many panels: shorter rows, still room for labels
    for summary in summaries.values():
        heights.append(rows_height(summary.ranks, per_row) + (0.3 if comm else 0.0))
        if memories is not None:
            heights.append(1.3)
    # Many panels (every schedule, each with memory) shrink together to stay within MAX_HEIGHT_IN.
    spacing = 0.35 * len(heights) + 1.2
    heights = [h * min(1.0, (MAX_HEIGHT_IN - spacing) / sum(heights)) for h in heights]
    fig = Figure(figsize=(WIDTH_IN, sum(heights) + spacing), layout="constrained")
    axes = list(fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights}, squeeze=False)[:, 0])
    kinds: set[str] = set()
    chunks = 1
    memory_axes, top = [], 0.0
    if memories is not None and unit_bytes is None:  # one byte unit for every panel, as they share a scale
        common_label, common = memory_unit(pd.concat([memories[k] for k in timelines if k in memories]), None, None)
        unit_bytes, unit_label = {k: common for k in timelines}, common_label
    for label, (step, frame) in chosen.items():
        summary = summaries[label]
        ax = axes.pop(0)
        draw_gantt(ax, frame, ranks=summary.ranks, chunks=summary.chunks, xmax=span * scale, unit=unit,
                   scale=scale, comm=comm)
        ax.set_title(panel_title(label, summary), fontsize=9, loc="left")
        ax.set_xlabel("")
        kinds |= set(frame["kind"])
        chunks = max(chunks, summary.chunks)
        if memories is not None:
            if label not in memories:
                raise ScheduleError(f"no memory table for {label!r}")
            ax = axes.pop(0)
            _, peak = draw_memory(
                ax, one_step(memories[label], step), ranks=summary.ranks, xmax=span * scale, scale=scale,
                unit=unit, unit_bytes=unit_bytes[label], unit_label=unit_label, legend=False, ylabel=False,
            )
            # Inside the panel: a y label beside a short panel would run into the rank labels.
            ax.text(0.0, 1.0, f"activations ({unit_label})", transform=ax.transAxes, fontsize=7, va="bottom",
                    color="#444444")
            ax.set_xlabel("")
            memory_axes.append(ax)
            top = max(top, peak)
    for ax in memory_axes:  # one memory scale: schedules compare at a glance
        ax.set_ylim(0.0, (top if top > 0 else 1.0) * 1.18)
    fig.axes[-1].set_xlabel(f"time ({unit})")
    if note:
        fig.suptitle(note, fontsize=9)
    handles = legend_handles(kinds, chunks, comm)
    if memories is not None and max(s.ranks for s in summaries.values()) <= 8:
        handles += rank_handles(max(s.ranks for s in summaries.values()))
    add_legend(fig, handles)
    return save(fig, path, dpi)
