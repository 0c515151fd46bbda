"""Order-level facts about a schedule or a stream that need no cost model."""

from __future__ import annotations

from typing import Sequence

from .ir import COMPUTE_KINDS, Action, Kind
from .schedule import Program, Schedule


def in_flight(schedule: Schedule) -> list[list[int]]:
    """Per rank, the number of stage-microbatches whose activations are held after each action.

    An F adds one; a B, or the W that ends a split backward, releases it. (I releases
    only part of a microbatch's activations, so it is not counted here; the simulator's
    memory model accounts for that split in bytes.)
    """
    counts = []
    for row in schedule.order:
        held, trace = 0, []
        for action in row:
            if action.kind is Kind.F:
                held += 1
            elif action.kind in (Kind.B, Kind.W):
                held -= 1
            trace.append(held)
        counts.append(trace)
    return counts


def peak_in_flight(schedule: Schedule) -> list[int]:
    """Per rank, the most stage-microbatches held at once (chunk-microbatches for v > 1)."""
    return [max(trace, default=0) for trace in in_flight(schedule)]


def places(stream: Sequence[Action]) -> list[int]:
    """Per action of one rank's stream: for a compute action, how many compute actions of its
    stage and kind come before it in the stream (0 for the first F of a stage in the step);
    -1 for the rest. The first actions of a stage in a step do different work on a real
    executor (the first backward assigns the weight gradients that later ones add to, the
    first forward finds the optimizer's data in the caches); the simulator can charge them
    their own factor and the calibration measures it."""
    seen: dict[tuple[int, Kind], int] = {}
    out: list[int] = []
    compute = frozenset(COMPUTE_KINDS)
    for action in stream:
        if action.kind in compute:
            key = (action.stage, action.kind)
            count = seen.get(key, 0)
            out.append(count)
            seen[key] = count + 1
        else:
            out.append(-1)
    return out


def switches(stream: Sequence[Action]) -> list[bool]:
    """Per action of one rank's stream: whether it is a compute action that does not repeat
    the stage and kind of the rank's previous compute action (the rank's first compute
    action switches). On a CPU the caches then hold another working set; the simulator
    charges such actions more and the calibration measures by how much."""
    flags: list[bool] = []
    append = flags.append
    previous = None  # (stage, kind) of the previous compute action
    compute = frozenset(COMPUTE_KINDS)  # a set lookup: this runs once per action of every simulation
    for action in stream:
        kind = action.kind
        if kind in compute:
            here = (action.stage, kind)
            append(here != previous)
            previous = here
        else:
            append(False)
    return flags


def stage_switches(stream: Sequence[Action]) -> list[bool]:
    """Per action of one rank's stream: whether it is a compute action whose rank's previous
    compute action had another stage (the rank's first compute action has none: False). Of the
    actions `switches` flags, these find another stage's weights in the caches, the others
    (same stage, another kind) their own; bench/repeat_costs.py tells the two apart."""
    flags: list[bool] = []
    previous = None  # stage of the previous compute action
    compute = frozenset(COMPUTE_KINDS)
    for action in stream:
        if action.kind in compute:
            flags.append(previous is not None and action.stage != previous)
            previous = action.stage
        else:
            flags.append(False)
    return flags


def run_lengths(stream: Sequence[Action]) -> list[int]:
    """Per action of one rank's stream: for a compute action, how many compute actions of its
    stage and kind the rank has run in a row up to and including it (1: it switches, as
    `switches` says); 0 for the rest. GPipe's phases count up to m; 1F1B's steady state stays at
    1. A CPU's caches warm over more than one repeat (bench/repeat_costs.py measures it)."""
    out: list[int] = []
    append = out.append
    length = 0
    previous = None  # (stage, kind) of the previous compute action, as `switches` keeps it
    compute = frozenset(COMPUTE_KINDS)  # one pass: this runs once per action of every simulation
    for action in stream:
        kind = action.kind
        if kind in compute:
            here = (action.stage, kind)
            length = length + 1 if here == previous else 1
            previous = here
            append(length)
        else:
            append(0)
    return out


def split_forwards(stream: Sequence[Action]) -> list[bool]:
    """Per action of one rank's stream: whether it is an F whose backward the stream splits
    into I and W (an I of its stage and microbatch follows it). Such a forward does more than
    a plain one: the executor runs each weight's layer behind a bridge that keeps what W needs
    (runtime.split), so the simulator prices it apart and the calibration measures it apart."""
    split = {(a.stage, a.microbatch) for a in stream if a.kind is Kind.I}
    return [a.kind is Kind.F and (a.stage, a.microbatch) in split for a in stream]


def longest_repeats(program: Program) -> dict[str, int]:
    """Per compute kind the program runs: its longest run of repeats on any rank."""
    out: dict[str, int] = {}
    for stream in program.streams:
        for action, length in zip(stream, run_lengths(stream)):
            if length:
                kind = action.kind.value
                out[kind] = max(out.get(kind, 0), length)
    return out


def switches_stage(program: Program) -> bool:
    """Whether some rank of the program switches between stages."""
    return any(any(stage_switches(stream)) for stream in program.streams)
