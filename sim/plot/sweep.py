"""A sweep table (`python -m sim sweep`) as curves: time per microbatch and bubble ratio against m."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from schedules import ScheduleError

from .figure import WIDTH_IN, save
from .style import OKABE_ITO
from .units import time_unit

SWEEP_COLUMNS = ("schedule", "ranks", "microbatches", "chunks", "time_per_microbatch", "bubble_ratio")
MARKERS = "osD^vP*Xh<>"
# Okabe-Ito (sim.plot.style) first, then matplotlib's tab10 for longer tables.
LINE_COLOURS = [OKABE_ITO[k] for k in ("blue", "orange", "bluish_green", "vermillion", "reddish_purple", "sky_blue",
                                      "black")] + ["#8c564b", "#7f7f7f", "#bcbd22", "#17becf"]


def plot_sweep(table: pd.DataFrame, *, note: str | None = None, path=None, dpi: int = 150) -> Figure:
    """Two rows of panels, time per microbatch and bubble ratio against m, one column per p;
    one line per schedule (and chunk count, where a sweep varies it). ScheduleError when the
    table lacks a column a sweep writes or has no rows."""
    missing = [c for c in SWEEP_COLUMNS if c not in table.columns]
    if missing:
        raise ScheduleError(f"not a sweep table (python -m sim sweep): no column {', '.join(missing)}")
    if table.empty:
        raise ScheduleError("the sweep table has no rows")
    ranks = sorted(table["ranks"].unique())
    unit, scale = time_unit(float(table["time_per_microbatch"].max()))
    fig = Figure(figsize=(WIDTH_IN, 5.2), layout="constrained")
    axes = fig.subplots(2, len(ranks), sharex=True, squeeze=False)
    varies = {name: rows["chunks"].nunique() > 1 for name, rows in table.groupby("schedule")}
    keys = list(dict.fromkeys(zip(table["schedule"], table["chunks"])))  # one style per line, on every panel
    styles = {key: {"marker": MARKERS[i % len(MARKERS)], "color": LINE_COLOURS[i % len(LINE_COLOURS)],
                    "markersize": 4, "linewidth": 1.2} for i, key in enumerate(keys)}
    ticks = sorted(int(m) for m in table["microbatches"].unique())
    lines = {}
    for column, p in enumerate(ranks):
        at_p = table[table["ranks"] == p]
        for (name, chunks), rows in at_p.groupby(["schedule", "chunks"], sort=False):
            rows = rows.sort_values("microbatches")
            label = f"{name} v={chunks}" if varies[name] else name
            style = {**styles[(name, chunks)], "label": label}
            lines[label] = axes[0, column].plot(rows["microbatches"], rows["time_per_microbatch"] * scale, **style)[0]
            axes[1, column].plot(rows["microbatches"], 100 * rows["bubble_ratio"], **style)
        axes[0, column].set_title(f"p = {p}", fontsize=9)
        axes[1, column].set_xlabel("microbatches m")
        for ax in axes[:, column]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(m) for m in ticks])
            ax.minorticks_off()
            ax.grid(True, linewidth=0.3, alpha=0.5)
            for spine in ("top", "right"):
                ax.spines[spine].set_visible(False)
    axes[0, 0].set_ylabel(f"time per microbatch ({unit})")
    axes[1, 0].set_ylabel("bubble ratio (%)")
    if note:
        fig.suptitle(note, fontsize=9)
    fig.legend(list(lines.values()), list(lines), loc="outside lower center", ncol=min(len(lines), 5),
               frameon=False, fontsize=8)
    return save(fig, path, dpi)
