"""GPipe (Huang et al., NeurIPS 2019): every forward, then every backward."""

from __future__ import annotations

from .ir import B, F
from .placement import looped
from .registry import register
from .schedule import Schedule


@register("gpipe", "GPipe: all forwards, then all backwards (m microbatches in flight)")
def gpipe(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    order = tuple(
        tuple(F(r, mb) for mb in range(microbatches)) + tuple(B(r, mb) for mb in range(microbatches))
        for r in range(ranks)
    )
    return Schedule("gpipe", ranks, microbatches, 1, looped(ranks, 1), order)
