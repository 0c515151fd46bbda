"""DualPipeV: DeepSeek's DualPipe cut in half onto the V placement (DeepSeek-AI,
"DeepSeek-V3 Technical Report", 2024, Sec. 3.2.1; the V form from Sea AI Lab's
"cut-in-half" note, as in github.com/deepseek-ai/DualPipe and torch.distributed.pipelining's
ScheduleDualPipeV).

Rank r holds chunk a = stage r and chunk b = stage 2p-1-r, as in ZB-V: a microbatch goes
down the ranks through the a chunks and back up through the b chunks. The steady state
pairs the forward of one microbatch with the full backward of another on the other chunk
(DualPipe runs such a pair at once, overlapping each one's communication with the other's
compute). Here a pair is two consecutive actions, F then B: the executor runs them one
after the other, and the simulator costs them as two actions, so DeepSeek's F&B (the time
of an overlapped pair) is F + B. Each rank runs eight phases (counts for rank r):

1. 2(p-r-1) forwards of chunk a;
2. r+1 pairs (F of a, F of b);
3. p-r-1 triples (I of b, the oldest W owed, F of b);
4. m-2p+r+1 rounds: the pair (F of a, B of b), then the pair (F of b, B of a);
5. p-r-1 rounds: B of b, then the pair (F of b, B of a);
6. r+1 pairs (backward of b, backward of a), full B in the first half and I from the
   middle on (from the b of the middle pair on odd ranks, from its a on even ranks);
7. p-r-1 pairs (the oldest W owed, I of a);
8. the r+1 W passes still owed, oldest first.

W passes are owed in the order of their I passes. The order needs m >= 2p; for fewer
microbatches it is the order of 2p microbatches with the missing ones left out (removing
whole microbatches keeps every dependency and cannot deadlock).

Bubble: DeepSeek's DualPipe README (and the V3 report's Table 2) gives DualPipeV on PP = 2p
stages over p ranks (PP/2 - 1)(F&B + B - 3W) per rank, F, B (full backward) and W per chunk.
With the pair run as one unit of F&B = F + B (no overlap gain, both outputs leaving when
it ends) the simulator gives exactly that whenever F = I and W <= F. Run as two actions,
the forward's output leaves when F ends, and every rank idles (p-1)(F + I - W) under the
same conditions, (p-1)F less (tests/test_dualpipev.py). Activations: PP + 1 = 2p+1
chunk-microbatches per rank once m >= 2p (p + 1/2 rank shares).
"""

from __future__ import annotations

from collections import deque

from .ir import Action, Kind
from .placement import vshape
from .registry import register
from .schedule import Schedule

_A, _B = 0, 1  # chunk a (stage r) and chunk b (stage 2p-1-r) of a rank


def _rank_order(p: int, r: int, m: int) -> list[Action]:
    """Rank r's order for m >= 2p microbatches."""
    stage = (r, 2 * p - 1 - r)
    forwards = [0, 0]  # next microbatch to run forward, per chunk
    backwards = [0, 0]  # next microbatch to run backward (B or I), per chunk
    owed: deque[Action] = deque()  # W passes owed, in the order of their I passes
    row: list[Action] = []

    def forward(chunk: int) -> None:
        row.append(Action(stage[chunk], Kind.F, forwards[chunk]))
        forwards[chunk] += 1

    def backward(chunk: int, split: bool) -> None:
        mb = backwards[chunk]
        backwards[chunk] += 1
        row.append(Action(stage[chunk], Kind.I if split else Kind.B, mb))
        if split:
            owed.append(Action(stage[chunk], Kind.W, mb))

    def weight() -> None:
        if owed:
            row.append(owed.popleft())

    for _ in range(2 * (p - r - 1)):
        forward(_A)
    for _ in range(r + 1):
        forward(_A)
        forward(_B)
    for _ in range(p - r - 1):
        backward(_B, split=True)
        weight()
        forward(_B)
    for _ in range(m - 2 * p + r + 1):
        forward(_A)
        backward(_B, split=False)
        forward(_B)
        backward(_A, split=False)
    for _ in range(p - r - 1):
        backward(_B, split=False)
        forward(_B)
        backward(_A, split=False)
    middle = (r + 1) // 2
    for i in range(r + 1):
        backward(_B, split=i > middle or (i == middle and r % 2 == 1))
        backward(_A, split=i >= middle)
    for _ in range(p - r - 1):
        weight()
        backward(_A, split=True)
    while owed:
        weight()
    return row


@register("dualpipev", "DualPipeV (DeepSeek): V placement, forward of one chunk paired with backward of the other",
          chunks=2)
def dualpipev(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p = ranks
    m = max(microbatches, 2 * p)
    order = tuple(
        tuple(a for a in _rank_order(p, r, m) if a.microbatch < microbatches) for r in range(p)
    )
    return Schedule("dualpipev", p, microbatches, 2, vshape(p), order)
