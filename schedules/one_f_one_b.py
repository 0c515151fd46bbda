"""1F1B, a.k.a. PipeDream-Flush (Narayanan et al., 2021; Fan et al. DAPPLE 2021).

Rank r runs min(p-r-1, m) warm-up forwards, then alternates one forward and one
backward, then drains the remaining backwards; at most min(p-r, m) microbatches
are in flight on rank r.
"""

from __future__ import annotations

from .ir import Action, B, F
from .placement import looped
from .registry import register
from .schedule import Schedule


@register("1f1b", "1F1B (PipeDream-Flush): warm-up forwards, one forward one backward, drain")
def one_f_one_b(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    order = []
    for r in range(ranks):
        warmup = min(ranks - r - 1, microbatches)
        row: list[Action] = [F(r, mb) for mb in range(warmup)]
        for i in range(microbatches - warmup):
            row += [F(r, warmup + i), B(r, i)]
        row += [B(r, mb) for mb in range(microbatches - warmup, microbatches)]
        order.append(tuple(row))
    return Schedule("1f1b", ranks, microbatches, 1, looped(ranks, 1), tuple(order))
