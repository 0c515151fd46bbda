"""ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 2.2).

ZB-H1 with extra warm-up forwards that fill the wait for the first gradient and the W
passes pushed to the tail, turning the pipeline's trapezoid into a parallelogram: rank
r runs 2(p-r)-1 forwards (with unit costs, exactly the time until I(0) reaches it),
then I(k), W(k-2r), F(2(p-r)-1+k) for each k, then the 2r W passes still owed. Every
rank holds at most 2p-1 microbatches (F done, W not yet).

Bubble (uniform stages, zero communication, T_F, T_B = I, T_W per rank's share,
m >= 2p-1), exactly when T_W <= T_F and 2T_W <= T_F+T_B: rank r idles
(p-1-r)(T_F+T_B-2T_W) within its own span (first action to last, as the paper counts
it), so the rank that idles most (rank 0) has the paper's (p-1)(T_F+T_B-2T_W), and
none does when T_F = T_B = T_W. Of the whole makespan every rank idles
(p-1)max(T_F, T_F+T_B-2T_W): the ranks' spans are staggered, which the paper accepts
by not synchronising the optimizer step across ranks (its post-validation). With
m < 2p-1 the warm-up is cut short and the bubble is larger.
"""

from __future__ import annotations

from .deferred_weight import deferred_weight_row
from .placement import looped
from .registry import register
from .schedule import Schedule


@register("zb-h2", "ZB-H2 (zero bubble, 2p-1 microbatches in flight): deeper warm-up, W passes at the tail")
def zb_h2(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    p = ranks
    order = tuple(
        deferred_weight_row(r, microbatches, warmup=2 * (p - r) - 1, delay=2 * r) for r in range(p)
    )
    return Schedule("zb-h2", p, microbatches, 1, looped(p, 1), order)
