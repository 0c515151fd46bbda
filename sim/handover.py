"""Activation bytes two stages on one rank share when one hands its output to the other.

Where stage s-1 and stage s sit on one rank (a V-shape's turn), s-1's output reaches s in
memory, as the same tensor: if s-1's activations hold that output (an MLP block's last
ReLU saves it) and s's hold their input (its first Linear does), one storage is held by
both, and counted once, the way a device's allocator holds it. The storage lives from
s-1's F until the later of the two stages' releases of it: each releases it when its B
ends, or with split backward when its I ends, or when its W ends if it keeps it for W.

The cost model prices each stage as if alone (sim.costs: F adds its activation bytes, B,
I and W free them), so on top of that, per microbatch: s's F allocates the shared bytes
less, and whichever of the two releases comes first in the rank's stream frees them less
(the later one frees them). `adjustments` gives these corrections by stream position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from schedules import Action, Kind


@dataclass(frozen=True)
class Handover:
    """The storage stage s-1's output and stage s's input share on one rank: its bytes, and
    whether each stage holds it until its W (else until its I) under split backward."""

    bytes: int
    upstream_until_w: bool
    downstream_until_w: bool


def handovers(stage_to_rank: Sequence[int], input_bytes: Sequence[int], input_weight_bytes: Sequence[int],
              output_bytes: Sequence[int], output_weight_bytes: Sequence[int]) -> tuple[Handover | None, ...]:
    """Per stage s, what it shares with stage s-1 (None: a stage on another rank, or nothing
    shared): the smaller of s-1's output bytes and s's input bytes its activations hold."""
    out: list[Handover | None] = [None]
    for s in range(1, len(stage_to_rank)):
        shared = min(output_bytes[s - 1], input_bytes[s])
        if stage_to_rank[s] != stage_to_rank[s - 1] or shared <= 0:
            out.append(None)
            continue
        out.append(Handover(shared, output_weight_bytes[s - 1] >= shared, input_weight_bytes[s] >= shared))
    return tuple(out)


def adjustments(stream: Sequence[Action], shared: Sequence[Handover | None]) -> dict[int, int]:
    """Bytes to add to the activation change of the actions at these positions of one rank's
    stream (module docstring); empty when nothing is shared."""
    if not any(shared):
        return {}
    out: dict[int, int] = {}
    released: set[tuple[int, int]] = set()  # (downstream stage, microbatch) whose storage one side freed
    for i, action in enumerate(stream):
        kind, stage, mb = action.kind, action.stage, action.microbatch
        if kind is Kind.F:
            if 0 <= stage < len(shared) and shared[stage] is not None:
                out[i] = -shared[stage].bytes
            continue
        if kind not in (Kind.B, Kind.I, Kind.W):
            continue
        for pair, downstream in ((stage, True), (stage + 1, False)):  # s as the receiver, as the sender
            handover = shared[pair] if 0 <= pair < len(shared) else None
            if handover is None or (pair, mb) in released:
                continue
            until_w = handover.downstream_until_w if downstream else handover.upstream_until_w
            if kind is Kind.B or (kind is Kind.W) == until_w:
                released.add((pair, mb))
                out[i] = out.get(i, 0) + handover.bytes
    return out
