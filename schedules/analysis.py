"""Order-level facts about a schedule that need no cost model."""

from __future__ import annotations

from .ir import Kind
from .schedule import Schedule


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
