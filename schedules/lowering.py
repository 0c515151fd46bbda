"""Lowering: insert the point-to-point actions that a compute-only schedule implies.

Rule (deterministic, one pass per rank): a RECV goes immediately before the compute
action that consumes the received tensor, a SEND immediately after the compute action
that produced it. Stages on the same rank hand tensors over in memory, with no action.
Lowering checks nothing: `schedules.checked` composes it with the validation.

With data parallelism (d > 1 replicas of the pipeline), `insert_grad_reductions` adds one
REDUCE_GRAD per stage right after the stage's last backward (B, or W with split
backward), as torch.distributed.pipelining's `_add_reduce_grad` places it, so that its
all-reduce overlaps the rest of the pipeline's drain.
"""

from __future__ import annotations

from .ir import REDUCE_GRAD, Action, Kind
from .schedule import Program, Schedule


def incoming(schedule: Schedule, action: Action) -> Action | None:
    """The RECV that must precede compute `action` on its rank, or None."""
    transfer = action.consumes(schedule.num_stages)
    if transfer is None:
        return None
    s2r = schedule.stage_to_rank
    return transfer.recv() if s2r[transfer.sender] != s2r[action.stage] else None


def outgoing(schedule: Schedule, action: Action) -> Action | None:
    """The SEND that must follow compute `action` on its rank, or None."""
    transfer = action.produces(schedule.num_stages)
    if transfer is None:
        return None
    s2r = schedule.stage_to_rank
    return transfer.send() if s2r[transfer.receiver] != s2r[action.stage] else None


def insert_comms(schedule: Schedule) -> Program:
    """The lowered Program of `schedule`, unchecked (schedules.lower is the checked form)."""
    # What a compute action needs depends on its stage and kind only, not on its microbatch:
    # the kinds of the RECV before it and of the SEND after it, once per (stage, kind).
    around: dict[tuple[int, Kind], tuple[Kind | None, Kind | None]] = {}
    streams = []
    for row in schedule.order:
        stream: list[Action] = []
        append = stream.append
        for action in row:
            stage, kind = action.stage, action.kind
            kinds = around.get((stage, kind))
            if kinds is None:
                probe = Action(stage, kind, 0)
                recv, send = incoming(schedule, probe), outgoing(schedule, probe)
                kinds = around[(stage, kind)] = (recv and recv.kind, send and send.kind)
            recv, send = kinds
            if recv is not None:
                append(_action(stage, recv, action.microbatch))
            append(action)
            if send is not None:
                append(_action(stage, send, action.microbatch))
        streams.append(tuple(stream))
    return Program(schedule=schedule, streams=tuple(streams))


def _action(stage: int, kind: Kind, microbatch: int, _new=object.__new__, _stage=Action.stage.__set__,
            _kind=Action.kind.__set__, _microbatch=Action.microbatch.__set__) -> Action:
    """Action(stage, kind, microbatch), equal to the one its constructor makes, for a third of
    the time: a frozen dataclass's __init__ is a Python frame with three object.__setattr__
    calls; this sets the three slots through their descriptors (the fields are trusted here)."""
    action = _new(Action)
    _stage(action, stage)
    _kind(action, kind)
    _microbatch(action, microbatch)
    return action


def insert_grad_reductions(program: Program) -> Program:
    """`program` with a REDUCE_GRAD after each stage's last B or W (unchecked)."""
    streams = []
    for stream in program.streams:
        last = {a.stage: i for i, a in enumerate(stream) if a.kind in (Kind.B, Kind.W)}
        after = {i: stage for stage, i in last.items()}
        out: list[Action] = []
        for i, action in enumerate(stream):
            out.append(action)
            if i in after:
                out.append(REDUCE_GRAD(after[i]))
        streams.append(tuple(out))
    return Program(schedule=program.schedule, streams=tuple(streams))
