"""Looped breadth-first schedule (Lamy-Poirier, "Breadth-First Pipeline Parallelism", 2022).

Each rank holds v stages on the looped placement (rank r holds stages r, r+p, ...) and
runs every microbatch through one local stage before moving on to the next: all
forwards of its first stage, then of its second, ..., then all backwards, last local
stage first, microbatches in order within each stage. It is GPipe run in v loops
around the ranks (v = 1 is exactly GPipe): m rank-shares of activations in flight on
every rank, and with uniform stages, zero communication and m >= p no rank waits
between loops, so the bubble ratio is (p-1)/(v m + p-1), as for interleaved 1F1B.
"""

from __future__ import annotations

from .ir import B, F
from .placement import looped
from .registry import register
from .schedule import Schedule


@register(
    "looped-bfs",
    "looped breadth-first (Lamy-Poirier): v looped stages per rank, each stage runs all microbatches",
    chunks=None,
    min_chunks=1,
)
def looped_bfs(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m, v = ranks, microbatches, chunks
    order = []
    for r in range(p):
        stages = [chunk * p + r for chunk in range(v)]
        row = [F(s, mb) for s in stages for mb in range(m)]
        row += [B(s, mb) for s in reversed(stages) for mb in range(m)]
        order.append(tuple(row))
    return Schedule("looped-bfs", p, m, v, looped(p, v), tuple(order))
