"""ZB-V: the V-shaped zero-bubble schedule (Qi et al., "Zero Bubble Pipeline Parallelism",
ICLR 2024, and "Pipeline Parallelism with Controllable Memory", NeurIPS 2024, V-ZB).

Two stages per rank on the V placement: rank r holds chunk a = stage r and chunk b =
stage 2p-1-r, so a microbatch goes down the ranks and back up, rank 0 holds both the
first and the last stage, and the turn at rank p-1 needs no transfer. Backward is split
into I and W. Each rank runs five phases (counts for rank r; with unit costs per chunk
action each phase fills the time until the inputs of the next are ready):

1. 2(p-r)-1 forwards of chunk a, while microbatch 0 comes down to stage 2p-1-r;
2. r pairs (F of chunk b, F of chunk a), while I(0) of chunk b comes up from rank 0;
3. p-r triples (F, I, W of chunk b), while I(0) of chunk a comes back from rank p-1;
4. six-action rounds F, I, W of chunk a then F, I, W of chunk b, while forwards remain
   (F of chunk a dropped once chunk a has run all m);
5. drain: r pairs (I of a, I of b), p-r pairs (I of a, W of a), then the W passes still
   owed, chunk b before chunk a.

A rank holds at most 2p chunk activations (F done, W not yet), i.e. p rank-shares, as
1F1B's rank 0. With T_F = T_B = T_W and zero communication, every rank computes without
a gap from its first action to its last once m >= 2p-1 (per-rank span, as the paper
counts it). For m < 2p-1 the order is that of 2p-1 microbatches with the missing ones
left out (removing whole microbatches keeps every dependency and cannot deadlock).
"""

from __future__ import annotations

from .ir import Action, Kind
from .placement import vshape
from .registry import register
from .schedule import Schedule

# One phase is a pattern of (chunk, kind) slots repeated a number of times.
_A, _B = 0, 1


def _phases(p: int, r: int, m: int) -> list[tuple[tuple[tuple[int, Kind], ...], int]]:
    """Rank r's phases 1-5 as (pattern, repeats), for m >= 2p-1; the owed W passes follow."""
    fa, ia, wa = (_A, Kind.F), (_A, Kind.I), (_A, Kind.W)
    fb, ib, wb = (_B, Kind.F), (_B, Kind.I), (_B, Kind.W)
    warmup_a = 2 * (p - r) - 1
    # Phases 2 and 3 run p forwards of chunk b; phase 4 runs one round per remaining one.
    return [
        ((fa,), warmup_a),
        ((fb, fa), r),
        ((fb, ib, wb), p - r),
        ((fa, ia, wa, fb, ib, wb), m - p),
        ((ia, ib), r),
        ((ia, wa), p - r),
    ]


def _rank_order(p: int, r: int, m: int, keep: int) -> tuple[Action, ...]:
    """Rank r's order for m >= 2p-1 microbatches, keeping those below `keep`."""
    stage = (r, 2 * p - 1 - r)
    issued = {(c, k): 0 for c in (_A, _B) for k in (Kind.F, Kind.I, Kind.W)}
    row: list[Action] = []

    def emit(chunk: int, kind: Kind) -> None:
        row.append(Action(stage[chunk], kind, issued[(chunk, kind)]))
        issued[(chunk, kind)] += 1

    for pattern, repeats in _phases(p, r, m):
        for _ in range(repeats):
            for chunk, kind in pattern:
                if not (kind is Kind.F and issued[(chunk, kind)] == m):  # phase 4, chunk a done
                    emit(chunk, kind)
    for chunk in (_B, _A):
        while issued[(chunk, Kind.W)] < m:
            emit(chunk, Kind.W)
    return tuple(a for a in row if a.microbatch < keep)


@register("zbv", "ZB-V: zero bubble on the V placement, 2 stages per rank, 1F1B memory", chunks=2)
def zbv(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p = ranks
    m = max(microbatches, 2 * p - 1)
    order = tuple(_rank_order(p, r, m, keep=microbatches) for r in range(p))
    return Schedule("zbv", p, microbatches, 2, vshape(p), order)
