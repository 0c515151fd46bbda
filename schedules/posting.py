"""Where an executor posts each receive of a lowered stream, ahead of its RECV.

Both the executor (runtime/executor.py, which posts them) and the calibration
(sim/calibration.py, which attributes the posting cost to the gaps that hold it)
read the placement from here, so they cannot disagree.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from .ir import Action

STEP = "step"  # every receive of the step posted before the stream's first action


def post_positions(stream: Sequence[Action], post_ahead: int | str) -> dict[int, int]:
    """For each RECV position of `stream`, the position of the action its receive is posted
    just before: with k > 0, the compute action k compute actions ahead of the RECV (the
    first action if there are fewer); with "step", the first action; with 0, the RECV
    itself (posted when the stream reaches it)."""
    recvs = [i for i, a in enumerate(stream) if a.kind.is_recv]
    if post_ahead == STEP:
        return {i: 0 for i in recvs}
    if post_ahead <= 0:
        return {i: i for i in recvs}
    computes = [i for i, a in enumerate(stream) if a.kind.is_compute]
    positions = {}
    for i in recvs:
        earlier = bisect_left(computes, i)  # compute actions before position i
        positions[i] = computes[earlier - post_ahead] if earlier >= post_ahead else 0
    return positions
