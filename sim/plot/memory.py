"""The memory figure: activation memory per rank over time, one panel per schedule, shared axes."""

from __future__ import annotations

from typing import Mapping

import pandas as pd
from matplotlib.figure import Figure

from schedules import ScheduleError

from ..metrics import one_step, step_summary
from .curves import draw_memory, memory_unit, rank_handles
from .figure import WIDTH_IN, save, step_of
from .gantt import add_legend
from .units import time_unit


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
    chosen = {label: step_of(timelines[label], None, 0, f"timeline {label!r}") for label in memories}
    summaries = {label: step_summary(frame) for label, (_, frame) in chosen.items()}
    span = max(s.makespan for s in summaries.values())
    unit, scale = time_unit(span)
    fig = Figure(figsize=(WIDTH_IN, 1.5 * len(memories) + 1.0), layout="constrained")
    axes = fig.subplots(len(memories), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    top, ranks = 0.0, 1
    if unit_bytes is None:  # one byte unit for every panel (they share the memory axis)
        unit_label, common = memory_unit(pd.concat(list(memories.values())), None, None)
        unit_bytes = {label: common for label in memories}
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
    fig.supylabel(f"activations held ({unit_label or 'panel units'})", fontsize=9)
    if note:
        fig.suptitle(note, fontsize=9)
    if ranks <= 8:
        add_legend(fig, rank_handles(ranks))
    return save(fig, path, dpi)
