"""Gantt drawing on one matplotlib Axes: one row per rank, boxes as a few collections.

Every box of a kind of lane is one polygon of a single PolyCollection, so 64 ranks x
256 microbatches (about 100,000 boxes) draw in seconds; text labels are added only
for boxes wide enough to hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.patches import Patch

from schedules.ir import COMM_NAMES, COMPUTE_NAMES, RECV_NAMES, SEND_NAMES

from .style import (
    KIND_COLOURS, KIND_LABELS, LANE_COLOUR, RECV_COLOUR, SEND_COLOUR, colour_table, shade, text_colour,
)

LABEL_FONT_PT = 6.5
MIN_LABEL_FONT_PT = 4.0
MAX_LABELS = 2000  # beyond this many labels the boxes are too small to read anyway
LAYOUT_SHRINK = 0.85  # constrained layout narrows the axes after we measure it


@dataclass(frozen=True)
class Lane:
    """A horizontal band inside each rank's row, as fractions of the row (0 = top, 1 = bottom)."""

    top: float
    bottom: float

    @property
    def height(self) -> float:
        return self.bottom - self.top


COMPUTE_LANE = Lane(0.08, 0.92)
COMPUTE_LANE_WITH_COMM = Lane(0.04, 0.66)
SEND_LANE = Lane(0.70, 0.82)
RECV_LANE = Lane(0.83, 0.95)


def box_vertices(x0: np.ndarray, x1: np.ndarray, y0: np.ndarray, y1: np.ndarray) -> np.ndarray:
    """Rectangles [x0, x1] x [y0, y1] as an (n, 4, 2) vertex array for PolyCollection."""
    return np.stack(
        [np.stack([x0, y0], -1), np.stack([x1, y0], -1), np.stack([x1, y1], -1), np.stack([x0, y1], -1)],
        axis=1,
    )


def setup_rank_axis(ax, ranks: int, xmax: float, unit: str, row_labels: list[str] | None = None) -> None:
    """Rows for `ranks` ranks (rank 0 on top), x from 0 to `xmax` in `unit`, light lane backgrounds."""
    ax.set_xlim(0.0, xmax)
    ax.set_ylim(ranks, 0.0)
    every = max(1, int(np.ceil(ranks / 16)))
    ticks = np.arange(0, ranks, every)
    ax.set_yticks(ticks + 0.5)
    labels = row_labels if row_labels is not None else [f"rank {r}" for r in range(ranks)]
    ax.set_yticklabels([labels[t] for t in ticks])
    ax.tick_params(axis="y", length=0, pad=4)
    ax.set_xlabel(f"time ({unit})")
    ax.add_collection(
        PolyCollection(
            box_vertices(np.zeros(ranks), np.full(ranks, xmax), np.arange(ranks) + 0.02, np.arange(ranks) + 0.98),
            facecolors=LANE_COLOUR, edgecolors="none", zorder=0,
        )
    )
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)


def _axes_points(ax) -> tuple[float, float]:
    """Width and height of `ax` in points, from its current position in the figure."""
    fig = ax.get_figure()
    width_in, height_in = fig.get_size_inches()
    pos = ax.get_position()
    return pos.width * width_in * 72.0 * LAYOUT_SHRINK, pos.height * height_in * 72.0


def _edge_width(widths_pt: np.ndarray) -> float:
    """White separators between adjacent boxes, dropped when boxes are a few points wide."""
    if widths_pt.size == 0 or np.median(widths_pt) < 3.0:
        return 0.0
    return 0.4


def draw_compute(
    ax,
    frame: pd.DataFrame,
    *,
    scale: float,
    chunks: int,
    lane: Lane = COMPUTE_LANE,
    row_of_rank: np.ndarray | None = None,
    labels: bool = True,
    alpha: float = 1.0,
    hatch: str | None = None,
) -> int:
    """Draw the F/B/I/W rows of `frame` as boxes in `lane`; returns how many labels were drawn.

    `row_of_rank[r]` is the row index of rank r (default: r); `scale` converts seconds to axis units.
    """
    compute = frame[frame["kind"].isin(COMPUTE_NAMES)]
    if compute.empty:
        return 0
    ranks = compute["rank"].to_numpy()
    rows = ranks if row_of_rank is None else row_of_rank[ranks]
    x0 = compute["start"].to_numpy(dtype=float) * scale
    x1 = compute["end"].to_numpy(dtype=float) * scale
    y0 = rows + lane.top
    y1 = rows + lane.bottom
    table = colour_table(max(chunks, 1))
    kinds = compute["kind"].to_numpy()
    chunk_ids = np.clip(compute["chunk"].to_numpy(), 0, max(chunks, 1) - 1)
    faces = np.array([table[(k, int(c))] for k, c in zip(kinds, chunk_ids)]) if len(kinds) else np.zeros((0, 3))

    width_pt, height_pt = _axes_points(ax)
    xspan = ax.get_xlim()[1] - ax.get_xlim()[0]
    yspan = abs(ax.get_ylim()[0] - ax.get_ylim()[1])
    widths_pt = (x1 - x0) / xspan * width_pt
    ax.add_collection(
        PolyCollection(
            box_vertices(x0, x1, y0, y1), facecolors=faces, edgecolors="white",
            linewidths=_edge_width(widths_pt), alpha=alpha, hatch=hatch, zorder=2,
        )
    )
    if not labels:
        return 0
    lane_pt = lane.height / yspan * height_pt
    if lane_pt < LABEL_FONT_PT * 1.15:
        return 0
    micro = compute["microbatch"].to_numpy()
    shown = faces * alpha + (1.0 - alpha)  # what a translucent box looks like on the light lane
    digits = np.floor(np.log10(np.maximum(micro, 1))).astype(int) + 1
    # A narrow box (a chunk of an interleaved or V schedule) gets a smaller font rather than no
    # number: down to MIN_LABEL_FONT_PT, below which digits stop being legible.
    sizes = np.minimum(LABEL_FONT_PT, widths_pt / (0.62 * digits + 0.3))
    fits = np.flatnonzero(sizes >= MIN_LABEL_FONT_PT)
    if fits.size > MAX_LABELS:
        return 0
    for i in fits:
        ax.text(
            (x0[i] + x1[i]) / 2, (y0[i] + y1[i]) / 2, str(micro[i]), ha="center", va="center",
            fontsize=round(float(sizes[i]), 1), color=text_colour(shown[i]), zorder=3, clip_on=True,
        )
    return int(fits.size)


def draw_comm(ax, frame: pd.DataFrame, *, scale: float) -> None:
    """Draw sends (on the wire) and receive waits on the thin lanes under each rank's boxes."""
    comm = frame[frame["kind"].isin(COMM_NAMES)]
    for kinds, lane, colour in ((SEND_NAMES, SEND_LANE, SEND_COLOUR), (RECV_NAMES, RECV_LANE, RECV_COLOUR)):
        part = comm[comm["kind"].isin(kinds) & (comm["end"] > comm["start"])]
        if part.empty:
            continue
        rows = part["rank"].to_numpy()
        ax.add_collection(
            PolyCollection(
                box_vertices(
                    part["start"].to_numpy(dtype=float) * scale, part["end"].to_numpy(dtype=float) * scale,
                    rows + lane.top, rows + lane.bottom,
                ),
                facecolors=colour, edgecolors="none", zorder=2,
            )
        )


def legend_handles(kinds: set[str], chunks: int, comm: bool = False) -> list:
    """Legend entries: the kinds present, chunk shades when v > 1, and comm lanes if drawn.

    A chunk's entry is a tuple of patches (draw it with HandlerTuple, see `add_legend`).
    """
    handles = [Patch(facecolor=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in COMPUTE_NAMES if k in kinds]
    if chunks > 1:  # one swatch per kind present, in that chunk's shade
        present = [k for k in COMPUTE_NAMES if k in kinds] or ["F"]
        handles += [
            tuple(Patch(facecolor=shade(KIND_COLOURS[k], c, chunks), label=f"chunk {c}") for k in present)
            for c in range(chunks)
        ]
    if comm:
        handles += [
            Patch(facecolor=SEND_COLOUR, label="send (lane)"),
            Patch(facecolor=RECV_COLOUR, label="recv wait (lane)"),
        ]
    return handles


def draw_gantt(
    ax,
    step_timeline: pd.DataFrame,
    *,
    ranks: int,
    chunks: int,
    xmax: float,
    unit: str,
    scale: float,
    comm: bool = False,
    labels: bool = True,
) -> None:
    """One step's timeline on `ax`: rows, compute boxes, optional comm lanes."""
    setup_rank_axis(ax, ranks, xmax, unit)
    lane = COMPUTE_LANE_WITH_COMM if comm else COMPUTE_LANE
    draw_compute(ax, step_timeline, scale=scale, chunks=chunks, lane=lane, labels=labels)
    if comm:
        draw_comm(ax, step_timeline, scale=scale)


def add_legend(fig, handles) -> None:
    """A figure legend under the axes; tuple entries show their patches side by side."""
    from matplotlib.legend_handler import HandlerTuple

    labels = [h[0].get_label() if isinstance(h, tuple) else h.get_label() for h in handles]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(handles), 4), frameon=False, fontsize=8,
               handler_map={tuple: HandlerTuple(ndivide=None, pad=0)})
