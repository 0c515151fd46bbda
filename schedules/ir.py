"""The instruction-level IR: action kinds, actions and the transfers between stages.

The text form of an action is the one `torch.distributed.pipelining` prints and parses:
stage index, kind, microbatch index, e.g. ``0F1``, ``3B0``, ``2SEND_B3``; a gradient
reduction names its stage only, ``1REDUCE_GRAD``, as torch's does.

A transfer (`Transfer`) is what one SEND and its RECV move: named by its direction,
the stage that sends it and the microbatch. `Action.transfer` is the one place that
names the transfer of a SEND or RECV; the lowering, the validation, the simulator's
matching of sends to receives and the executor's buffers and tags all go through it,
so that they cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import NamedTuple

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
    # All-reduce the stage's gradients over its data-parallel group, once per step after the
    # stage's last backward (torch.distributed.pipelining's REDUCE_GRAD); no microbatch.
    REDUCE_GRAD = "REDUCE_GRAD"

    @property
    def is_compute(self) -> bool:
        return self in _COMPUTE

    @property
    def is_comm(self) -> bool:
        """A point-to-point kind (SEND/RECV): it moves a transfer."""
        return self in _COMM

    @property
    def is_collective(self) -> bool:
        """A collective over the data-parallel group (REDUCE_GRAD): no transfer, no microbatch."""
        return self is Kind.REDUCE_GRAD

    @property
    def is_send(self) -> bool:
        return self in (Kind.SEND_F, Kind.SEND_B)

    @property
    def is_recv(self) -> bool:
        return self in (Kind.RECV_F, Kind.RECV_B)

    @property
    def produces_input_grad(self) -> bool:
        """True for B and I: they take the stage's output gradient and produce its input
        gradient (W, the weight-gradient half of a split backward, does neither)."""
        return self in (Kind.B, Kind.I)


# The kinds in a fixed order (legends, tables), and the names a timeline's "kind" column holds.
COMPUTE_KINDS: tuple[Kind, ...] = (Kind.F, Kind.B, Kind.I, Kind.W)
SEND_KINDS: tuple[Kind, ...] = (Kind.SEND_F, Kind.SEND_B)
RECV_KINDS: tuple[Kind, ...] = (Kind.RECV_F, Kind.RECV_B)
COMM_KINDS: tuple[Kind, ...] = (Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B)
COMPUTE_NAMES: tuple[str, ...] = tuple(k.value for k in COMPUTE_KINDS)
# The name that cost tables and the executor's profile give an F whose backward is split into I
# and W (schedules.analysis.split_forwards): it does more work than a plain F and is priced apart.
SPLIT_FORWARD = "F_split"
SEND_NAMES: tuple[str, ...] = tuple(k.value for k in SEND_KINDS)
RECV_NAMES: tuple[str, ...] = tuple(k.value for k in RECV_KINDS)
COMM_NAMES: tuple[str, ...] = tuple(k.value for k in COMM_KINDS)
_COMPUTE = frozenset(COMPUTE_KINDS)
_COMM = frozenset(COMM_KINDS)
# The microbatch field of an action without one (REDUCE_GRAD); its text form omits it.
NO_MICROBATCH = -1

# Longest names first so that e.g. "SEND_F" is not read as "S" + garbage.
_ACTION_RE = re.compile(r"(\d+)(" + "|".join(sorted((k.value for k in Kind), key=len, reverse=True)) + r")(\d*)")


class Direction(IntEnum):
    """Which way a transfer goes: activations down the stages, gradients back up."""

    FORWARD = 0
    BACKWARD = 1


class Transfer(NamedTuple):
    """One point-to-point transfer: `direction`, the `sender` stage and the `microbatch`.

    A forward transfer carries stage `sender`'s output activation to stage sender+1; a
    backward one carries stage `sender`'s input gradient to stage sender-1. A SEND and
    its RECV name the same transfer (`Action.transfer`).
    """

    direction: Direction
    sender: int
    microbatch: int

    @property
    def receiver(self) -> int:
        """The stage the transfer goes to."""
        return self.sender + 1 if self.direction is Direction.FORWARD else self.sender - 1

    @property
    def boundary(self) -> int:
        """The stage boundary it crosses: b for the boundary between stages b and b+1."""
        return self.sender if self.direction is Direction.FORWARD else self.sender - 1

    def send(self) -> "Action":
        """The SEND action of this transfer (on the sending stage)."""
        kind = Kind.SEND_F if self.direction is Direction.FORWARD else Kind.SEND_B
        return Action(self.sender, kind, self.microbatch)

    def recv(self) -> "Action":
        """The RECV action of this transfer (on the receiving stage)."""
        kind = Kind.RECV_F if self.direction is Direction.FORWARD else Kind.RECV_B
        return Action(self.receiver, kind, self.microbatch)

    def number(self, microbatches: int) -> int:
        """A dense number in 0 .. transfer_count(stages, microbatches) - 1, distinct per transfer
        (the simulator's transfer index, the executor's message tag); consecutive in the
        microbatch: microbatch 0's number plus the microbatch."""
        return (2 * self.sender + self.direction) * microbatches + self.microbatch


def transfer_count(num_stages: int, microbatches: int) -> int:
    """How many transfer numbers a program of these sizes may use (every number is below it)."""
    return 2 * num_stages * microbatches


# Per communication kind: the transfer's direction and its sending stage relative to the action's.
_TRANSFER_OF_KIND = {
    Kind.SEND_F: (Direction.FORWARD, 0),
    Kind.RECV_F: (Direction.FORWARD, -1),
    Kind.SEND_B: (Direction.BACKWARD, 0),
    Kind.RECV_B: (Direction.BACKWARD, 1),
}


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
        if self.kind.is_collective:
            return f"{self.stage}{self.kind.value}"
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> "Action":
        """Parse the text form (``0F1``); raises ScheduleError on anything else."""
        match = _ACTION_RE.fullmatch(text.strip())
        kind = None if match is None else Kind(match.group(2))
        if match is None or (match.group(3) == "") != kind.is_collective:
            raise ScheduleError(
                f"cannot parse action {text!r}: expected STAGE KIND MICROBATCH such as "
                "'0F1', '3B0', '2I1', '1W4' or '2SEND_B3', or STAGE REDUCE_GRAD such as '1REDUCE_GRAD'"
            )
        stage, _, microbatch = match.groups()
        return Action(int(stage), kind, NO_MICROBATCH if kind.is_collective else int(microbatch))

    @property
    def transfer(self) -> Transfer:
        """The transfer a SEND or RECV moves; ValueError for a compute action."""
        side = _TRANSFER_OF_KIND.get(self.kind)
        if side is None:
            raise ValueError(f"{self} is not a SEND or RECV and moves no transfer")
        return Transfer(side[0], self.stage + side[1], self.microbatch)

    def consumes(self, num_stages: int) -> Transfer | None:
        """The transfer whose data compute action `self` takes as input, wherever the two
        stages sit: an F the previous stage's activation, a B or I the next stage's
        gradient; None at the ends of the pipeline, for W and for SEND/RECV."""
        if self.kind is Kind.F:
            return Transfer(Direction.FORWARD, self.stage - 1, self.microbatch) if self.stage > 0 else None
        if self.kind.produces_input_grad and self.stage < num_stages - 1:
            return Transfer(Direction.BACKWARD, self.stage + 1, self.microbatch)
        return None

    def produces(self, num_stages: int) -> Transfer | None:
        """The transfer compute action `self` produces the data of: an F its activation for
        the next stage, a B or I its input gradient for the previous one; None at the ends
        of the pipeline, for W and for SEND/RECV."""
        if self.kind is Kind.F:
            return Transfer(Direction.FORWARD, self.stage, self.microbatch) if self.stage < num_stages - 1 else None
        if self.kind.produces_input_grad and self.stage > 0:
            return Transfer(Direction.BACKWARD, self.stage, self.microbatch)
        return None

    def peer_stage(self) -> int | None:
        """For a communication action, the stage on the other end of the transfer."""
        if not self.kind.is_comm:
            return None
        transfer = self.transfer
        return transfer.receiver if self.kind.is_send else transfer.sender

    def matching(self) -> "Action":
        """The other half of a send/receive pair."""
        if not self.kind.is_comm:
            raise ValueError(f"{self} is not a SEND or RECV and has no matching transfer")
        transfer = self.transfer
        return transfer.recv() if self.kind.is_send else transfer.send()


def F(stage: int, microbatch: int) -> Action:
    return Action(stage, Kind.F, microbatch)


def B(stage: int, microbatch: int) -> Action:
    return Action(stage, Kind.B, microbatch)


def I(stage: int, microbatch: int) -> Action:  # noqa: E741,E743
    return Action(stage, Kind.I, microbatch)


def W(stage: int, microbatch: int) -> Action:
    return Action(stage, Kind.W, microbatch)


def REDUCE_GRAD(stage: int) -> Action:  # noqa: N802  (named as torch names the kind)
    return Action(stage, Kind.REDUCE_GRAD, NO_MICROBATCH)
