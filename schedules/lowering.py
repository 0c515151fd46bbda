"""Lowering: insert the point-to-point actions that a compute-only schedule implies.

Rule (deterministic, one pass per rank): a RECV goes immediately before the compute
action that consumes the received tensor, a SEND immediately after the compute action
that produced it. Stages on the same rank hand tensors over in memory, with no action.
"""

from __future__ import annotations

from .ir import Action, Kind
from .schedule import Program, Schedule


def incoming(schedule: Schedule, action: Action) -> Action | None:
    """The RECV that must precede compute `action` on its rank, or None."""
    s2r = schedule.stage_to_rank
    if action.kind is Kind.F and action.stage > 0:
        if s2r[action.stage - 1] != s2r[action.stage]:
            return Action(action.stage, Kind.RECV_F, action.microbatch)
    elif action.kind.is_backward and action.stage < schedule.num_stages - 1:
        if s2r[action.stage + 1] != s2r[action.stage]:
            return Action(action.stage, Kind.RECV_B, action.microbatch)
    return None


def outgoing(schedule: Schedule, action: Action) -> Action | None:
    """The SEND that must follow compute `action` on its rank, or None."""
    s2r = schedule.stage_to_rank
    if action.kind is Kind.F and action.stage < schedule.num_stages - 1:
        if s2r[action.stage + 1] != s2r[action.stage]:
            return Action(action.stage, Kind.SEND_F, action.microbatch)
    elif action.kind.is_backward and action.stage > 0:
        if s2r[action.stage - 1] != s2r[action.stage]:
            return Action(action.stage, Kind.SEND_B, action.microbatch)
    return None


def insert_comms(schedule: Schedule) -> Program:
    """Lower without validating (validation itself uses this)."""
    streams = []
    for row in schedule.order:
        stream: list[Action] = []
        for action in row:
            recv = incoming(schedule, action)
            if recv is not None:
                stream.append(recv)
            stream.append(action)
            send = outgoing(schedule, action)
            if send is not None:
                stream.append(send)
        streams.append(tuple(stream))
    return Program(schedule=schedule, streams=tuple(streams))


def lower(schedule: Schedule) -> Program:
    """Validate `schedule` and return its lowered Program; raises ScheduleError."""
    from .validate import check_program, check_rules

    check_rules(schedule)
    program = insert_comms(schedule)
    check_program(program)
    return program
