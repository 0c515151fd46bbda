"""Interleaved 1F1B (Narayanan et al., SC'21), in the form Megatron-LM runs it.

Each rank holds v >= 2 model chunks on the looped placement (rank r holds stages
r, r+p, ...). Microbatches pass through the chunks in groups of g (default p): the
forward sequence on every rank is, group by group, chunk 0 for the group's
microbatches, then chunk 1, ...; the backward sequence is the same with the chunk
order mirrored. Rank r runs (p-r-1)*2 + (v-1)*g warm-up forwards (capped at m*v),
then alternates one forward and one backward, then drains.
"""

from __future__ import annotations

from .errors import ScheduleError
from .ir import Action, B, F
from .placement import looped
from .registry import register
from .schedule import Schedule


def allowed_microbatches(group_size: int) -> str:
    return f"multiples of the group size {group_size} ({group_size}, {2 * group_size}, {3 * group_size}, ...)"


def sequence(microbatches: int, chunks: int, group_size: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) pairs in the order a rank runs its forwards."""
    pairs = []
    for start in range(0, microbatches, group_size):
        group = range(start, min(start + group_size, microbatches))
        pairs += [(mb, chunk) for chunk in range(chunks) for mb in group]
    return pairs


@register(
    "interleaved",
    "interleaved 1F1B (Megatron-LM): v chunks per rank, microbatches in groups of p",
    chunks=None,
    min_chunks=2,
)
def interleaved(ranks: int, microbatches: int, chunks: int = 2, group_size: int | None = None) -> Schedule:
    p, m, v = ranks, microbatches, chunks
    g = p if group_size is None else group_size
    if g < p:
        raise ScheduleError(f"interleaved needs group_size >= ranks ({p}); got group_size={g}")
    if m % g != 0:
        raise ScheduleError(
            f"interleaved with p={p} and group size {g} cannot run m={m} microbatches; "
            f"allowed m: {allowed_microbatches(g)}"
        )
    forward = sequence(m, v, g)
    backward = [(mb, v - 1 - chunk) for mb, chunk in forward]
    total = m * v
    order = []
    for r in range(p):
        def fwd(k: int) -> Action:
            mb, chunk = forward[k]
            return F(chunk * p + r, mb)

        def bwd(k: int) -> Action:
            mb, chunk = backward[k]
            return B(chunk * p + r, mb)

        warmup = min((p - r - 1) * 2 + (v - 1) * g, total)
        row = [fwd(k) for k in range(warmup)]
        for i in range(total - warmup):
            row += [fwd(warmup + i), bwd(i)]
        row += [bwd(k) for k in range(total - warmup, total)]
        order.append(tuple(row))
    return Schedule("interleaved", p, m, v, looped(p, v), tuple(order))
