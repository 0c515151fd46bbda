"""The instruction-level IR: action kinds and actions, with the field's text form.

The text form is the one `torch.distributed.pipelining` prints and parses:
stage index, kind, microbatch index, e.g. ``0F1``, ``3B0``, ``2SEND_B3``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from .errors import ScheduleError


class Kind(str, Enum):
    """What an action does. Compute kinds first, then point-to-point kinds."""

    F = "F"  # forward
    B = "B"  # full backward (input and weight gradients)
    I = "I"  # noqa: E741  backward for the stage input only
    W = "W"  # backward for the weights only
    SEND_F = "SEND_F"  # send a forward activation to the next stage
    RECV_F = "RECV_F"  # receive a forward activation from the previous stage
    SEND_B = "SEND_B"  # send an input gradient to the previous stage
    RECV_B = "RECV_B"  # receive an output gradient from the next stage

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        return not self.is_compute

    @property
    def is_send(self) -> bool:
        return self in (Kind.SEND_F, Kind.SEND_B)

    @property
    def is_recv(self) -> bool:
        return self in (Kind.RECV_F, Kind.RECV_B)

    @property
    def is_backward(self) -> bool:
        """True for the kinds that produce the stage's input gradient (B and I)."""
        return self in (Kind.B, Kind.I)


COMPUTE_KINDS = frozenset({Kind.F, Kind.B, Kind.I, Kind.W})

# Longest names first so that e.g. "SEND_F" is not read as "S" + garbage.
_ACTION_RE = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)")


@dataclass(frozen=True, order=True, slots=True)
class Action:
    """One instruction: run `kind` for `microbatch` on pipeline `stage`.

    For communication kinds, `stage` follows torch.distributed.pipelining: a SEND
    carries the sending stage, a RECV the receiving stage (``1SEND_F0`` pairs with
    ``2RECV_F0``; ``2SEND_B0`` pairs with ``1RECV_B0``).
    """

    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> "Action":
        """Parse the text form (``0F1``); raises ScheduleError on anything else."""
        match = _ACTION_RE.fullmatch(text.strip())
        if match is None:
            raise ScheduleError(
                f"cannot parse action {text!r}: expected STAGE KIND MICROBATCH such as "
                "'0F1', '3B0', '2I1', '1W4' or '2SEND_B3'"
            )
        stage, kind, microbatch = match.groups()
        return Action(int(stage), Kind(kind), int(microbatch))

    def peer_stage(self) -> int | None:
        """For a communication action, the stage on the other end of the transfer."""
        if self.kind is Kind.SEND_F:
            return self.stage + 1
        if self.kind is Kind.RECV_F:
            return self.stage - 1
        if self.kind is Kind.SEND_B:
            return self.stage - 1
        if self.kind is Kind.RECV_B:
            return self.stage + 1
        return None

    def matching(self) -> "Action":
        """The other half of a send/receive pair."""
        if self.kind is Kind.SEND_F:
            return Action(self.stage + 1, Kind.RECV_F, self.microbatch)
        if self.kind is Kind.RECV_F:
            return Action(self.stage - 1, Kind.SEND_F, self.microbatch)
        if self.kind is Kind.SEND_B:
            return Action(self.stage - 1, Kind.RECV_B, self.microbatch)
        if self.kind is Kind.RECV_B:
            return Action(self.stage + 1, Kind.SEND_B, self.microbatch)
        raise ValueError(f"{self} is a compute action and has no matching transfer")


def F(stage: int, microbatch: int) -> Action:
    return Action(stage, Kind.F, microbatch)


def B(stage: int, microbatch: int) -> Action:
    return Action(stage, Kind.B, microbatch)


def I(stage: int, microbatch: int) -> Action:  # noqa: E741,E743
    return Action(stage, Kind.I, microbatch)


def W(stage: int, microbatch: int) -> Action:
    return Action(stage, Kind.W, microbatch)
