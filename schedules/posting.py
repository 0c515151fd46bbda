"""Where and in what order an executor posts the receives of a lowered stream.

Both the executor (runtime/executor.py, which posts them) and the calibration
(sim/calibration.py, which attributes the posting cost to the gaps that hold it)
read the placement from here, so they cannot disagree. `posting_plan` is the order a
transport that matches a sender's messages in posting order (NCCL) must keep.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

from .errors import ScheduleError
from .ir import Action, Transfer
from .schedule import Program

STEP = "step"  # how --post-ahead and summary.json write whole-step posting


@dataclass(frozen=True)
class PostAhead:
    """When each receive is posted: `computes` compute actions before its RECV (0: at the
    RECV itself), or, with `whole_step`, every receive of the step before the stream's
    first action. Written as a count or "step" (`parse`, `written`)."""

    computes: int = 0
    whole_step: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.computes, bool) or not isinstance(self.computes, int) or self.computes < 0:
            raise ScheduleError(f"receives are posted 0 or more compute actions ahead, not {self.computes!r}")
        if self.whole_step and self.computes:
            raise ScheduleError("whole-step posting takes no count of compute actions")

    @classmethod
    def step(cls) -> "PostAhead":
        """Every receive of the step posted at its start."""
        return cls(whole_step=True)

    @classmethod
    def parse(cls, written: int | str) -> "PostAhead":
        """From the written form: a count of compute actions, or "step"; ScheduleError otherwise."""
        if written == STEP:
            return cls.step()
        if isinstance(written, bool) or not isinstance(written, int):
            raise ScheduleError(f"post-ahead is a count of compute actions or {STEP!r}, not {written!r}")
        return cls(written)

    @property
    def written(self) -> int | str:
        """The form --post-ahead and summary.json use: the count, or "step"."""
        return STEP if self.whole_step else self.computes

    @property
    def at_recv(self) -> bool:
        """Whether each receive is posted by its own RECV (nothing is posted ahead)."""
        return not self.whole_step and self.computes == 0


def post_positions(stream: Sequence[Action], ahead: PostAhead) -> dict[int, int]:
    """For each RECV position of `stream`, the position of the action its receive is posted
    just before: with k > 0 compute actions ahead, the compute action k compute actions
    ahead of the RECV (the first action if there are fewer); whole-step, the first action;
    at the RECV, the RECV itself (posted when the stream reaches it)."""
    recvs = [i for i, a in enumerate(stream) if a.kind.is_recv]
    if ahead.whole_step:
        return {i: 0 for i in recvs}
    if ahead.at_recv:
        return {i: i for i in recvs}
    k = ahead.computes
    computes = [i for i, a in enumerate(stream) if a.kind.is_compute]
    positions = {}
    for i in recvs:
        earlier = bisect_left(computes, i)  # compute actions before position i
        positions[i] = computes[earlier - k] if earlier >= k else 0
    return positions


def posted_before(stream: Sequence[Action], ahead: PostAhead) -> list[int]:
    """Per position of `stream`, how many receives are posted just before that action
    (`post_positions`; a receive posted at its RECV is posted inside the RECV, so it counts
    before no action). Entry 0 is what a rank posts before its first action: with whole-step
    posting, every receive of its step."""
    counts = [0] * len(stream)
    if not ahead.at_recv:
        for at in post_positions(stream, ahead).values():
            counts[at] += 1
    return counts


def posted_first(stream: Sequence[Action], ahead: PostAhead) -> int:
    """How many receives a rank posts before its stream's first action (`posted_before`'s
    entry 0; 0 for an empty stream): the executor posts them before it starts the stream."""
    return posted_before(stream, ahead)[0] if stream else 0


def posting_plan(program: Program, rank: int) -> dict[int, tuple[Transfer, ...]]:
    """For each RECV position of `rank`'s stream, the transfers to post there, for a transport
    that matches a sender's messages in posting order: they come from one sender, in that
    sender's SEND order: the RECV's own transfer plus any earlier one of the sender not yet
    posted."""
    s2r = program.schedule.stage_to_rank
    send_order: dict[int, list[Transfer]] = {}
    for src, stream in enumerate(program.streams):
        if src == rank:
            continue
        send_order[src] = [a.transfer for a in stream if a.kind.is_send and s2r[a.transfer.receiver] == rank]
    posted: dict[int, int] = {src: 0 for src in send_order}
    index = {src: {t: i for i, t in enumerate(order)} for src, order in send_order.items()}
    plan: dict[int, tuple[Transfer, ...]] = {}
    for pos, action in enumerate(program.streams[rank]):
        if not action.kind.is_recv:
            continue
        transfer = action.transfer
        src = s2r[transfer.sender]
        j = index[src][transfer]
        plan[pos] = tuple(send_order[src][posted[src] : j + 1])
        posted[src] = max(posted[src], j + 1)
    return plan
