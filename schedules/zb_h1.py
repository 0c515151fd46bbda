"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 2.1).

1F1B with the backward split into I and W, and rank r's W passes started r
microbatches late: rank r runs p-r forwards, then I(k), W(k-r), F(p-r+k) for each k,
then the r W passes still owed. Rank r thus holds at most p microbatches (F done, W
not yet), the peak that 1F1B reaches on rank 0, and the W passes that would sit
inside 1F1B's drain bubbles fill them instead.

Bubble (uniform stages, zero communication, T_F, T_B = I, T_W per rank's share, m >= p),
exactly when T_W <= T_F and T_W <= T_B: every rank idles (p-1)(T_F+T_B-T_W) of the
makespan, and rank r idles (p-1-r)(T_F+T_B-T_W) within its own span (first action to
last), so both counts give the paper's (p-1)(T_F+T_B-T_W) on the rank that idles most.
With a slower W every rank idles (p-1)(T_F+T_B-min(T_F,T_B,T_W)) of the makespan; with
m < p the pipeline never fills and the bubble is larger.
"""

from __future__ import annotations

from .deferred_weight import deferred_weight_row
from .placement import looped
from .registry import register
from .schedule import Schedule


@register("zb-h1", "ZB-H1 (zero bubble, 1F1B memory): split backward, W deferred r microbatches on rank r")
def zb_h1(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    p = ranks
    order = tuple(deferred_weight_row(r, microbatches, warmup=p - r, delay=r) for r in range(p))
    return Schedule("zb-h1", p, microbatches, 1, looped(p, 1), order)
