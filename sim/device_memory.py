"""Peak device memory of each rank: static bytes plus the most that activations and transfer
buffers hold at once, walked in each rank's stream order.

`sim.costs` models activation memory only (and reports ``static_memory`` beside it). A
device's peak (what ``torch.cuda.max_memory_allocated`` measures) also holds what the
executor keeps for its transfers. Per rank, in bytes:

- **static**, held for the whole step: the weights of the rank's stages, one gradient
  per weight (a step's first backward of a stage allocates them, and they stay),
  optimizer state (``optimizer_per_weight_byte`` x weights: 2 for Adam's two fp32
  moments, 0 without an optimizer, as in the executor's steps), and the batch (the
  executor puts the whole batch, inputs and targets, on every rank);
- **activations**: the simulator's rule (sim.engine): a stage's ``activation_memory``
  from the start of its F to the end of its B; with split backward ``weight_memory`` of
  it stays from the end of I to the end of W;
- **receive buffers**: a receive's buffer exists from its posting, before the action
  that `schedules.posting.post_positions` names for the executor's ``post_ahead``, until
  its consumer: an activation received for F becomes that F's input, which the stage's
  first layer saves, so it is inside the stage's activation bytes from the F's start; a
  gradient received for B (or I) is freed when that backward ends;
- **sent tensors**, held until the step ends (the executor waits on every send there, and
  a backend keeps a send's tensor until it completes): a sent activation is the stage's
  output, assumed among the tensors its F saved (its last layer saves its output, as
  ReLU does), so it counts on its own from the end of the B (or I) that frees the
  activation; a sent gradient counts from the end of the backward that produced it. A
  gradient handed to a stage on the same rank is held from that backward's end to the
  end of the receiving stage's backward.

Sizes of transfers come from the cost model's ``p2p_activation_bytes`` and
``p2p_gradient_bytes`` (per boundary). Within an action, what it frees at its end goes
before what it produces there (autograd frees saved tensors as backward proceeds, and
the input gradient comes last). Not counted: temporaries inside an action (a backward's
working set: autograd's intermediate gradients, and each new weight gradient before it is
added to the one in .grad; measured on the CPU for an mlp, bench/device_memory_cpu.py, it is
one layer's parameters plus up to two boundary tensors), library workspaces (cuBLAS),
allocator rounding, and receives that the NCCL transport posts earlier than their own place
to keep a sender's order (only the V placement's schedules receive out of send order). Memory on one rank depends only on its
own order of actions, not on timing, so walking the stream gives the simulator's peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules import Kind, Program
from schedules.posting import PostAhead, post_positions

from .costs import CostError, CostModel
from .handover import adjustments


@dataclass(frozen=True)
class ExecutorMemory:
    """What a rank holds besides activations: per-stage weight bytes, the batch bytes on
    every rank, optimizer state per weight byte, and where receives are posted."""

    weight_bytes: tuple[int, ...]  # per stage
    batch_bytes: int = 0
    optimizer_per_weight_byte: float = 0.0
    post_ahead: int | str = 0  # as written in summary.json: a count or "step"


@dataclass(frozen=True)
class DeviceMemory:
    """Predicted peak of one rank (bytes) and what it holds at that moment."""

    rank: int
    weights: int
    gradients: int
    optimizer: int
    batch: int
    activations: int
    receive_buffers: int
    send_buffers: int

    @property
    def static(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.batch

    @property
    def peak(self) -> int:
        return self.static + self.activations + self.receive_buffers + self.send_buffers


def peak_device_memory(program: Program, costs: CostModel, executor: ExecutorMemory) -> tuple[DeviceMemory, ...]:
    """Per rank, the predicted peak device memory of one step of `program` (rules: module docstring)."""
    schedule = program.schedule
    n = schedule.num_stages
    if len(executor.weight_bytes) != n:
        raise CostError(f"weight_bytes lists {len(executor.weight_bytes)} stages, the program has {n}")
    resolved = costs.for_schedule(schedule)
    sent = _per_boundary(costs.p2p_activation_bytes, n)
    grads = sent if costs.p2p_gradient_bytes is None else _per_boundary(costs.p2p_gradient_bytes, n)
    out = []
    for rank, stream in enumerate(program.streams):
        weights = sum(executor.weight_bytes[s] for s in schedule.rank_stages[rank])
        moving = _transient_peak(stream, schedule.stage_to_rank, rank, resolved.memory, resolved.weight_memory,
                                 adjustments(stream, resolved.handover), sent, grads, executor.post_ahead)
        out.append(DeviceMemory(
            rank=rank, weights=weights, gradients=weights,
            optimizer=round(executor.optimizer_per_weight_byte * weights), batch=executor.batch_bytes,
            activations=moving[0], receive_buffers=moving[1], send_buffers=moving[2],
        ))
    return tuple(out)


def _per_boundary(value, num_stages: int) -> tuple[int, ...]:
    boundaries = max(num_stages - 1, 0)
    if isinstance(value, tuple):
        return tuple(round(x) for x in value)
    return (round(value),) * boundaries


def _transient_peak(stream, stage_to_rank, rank, memory, kept, shared, sent, grads, post_ahead
                    ) -> tuple[int, int, int]:
    """(activations, receive buffers, sent and handed-over tensors) at the rank's peak;
    `shared`: sim.handover's adjustments of the stream's activation changes."""
    posted_before: dict[int, list[int]] = {}
    for recv, at in post_positions(stream, PostAhead.parse(post_ahead)).items():
        posted_before.setdefault(at, []).append(recv)
    sends_forward = {(a.stage, a.microbatch) for a in stream if a.kind is Kind.SEND_F}
    sends_backward = {(a.stage, a.microbatch) for a in stream if a.kind is Kind.SEND_B}
    receiving: dict[tuple[Kind, int, int], int] = {}  # (RECV kind, stage, mb) -> bytes, while posted
    handed: dict[tuple[int, int], int] = {}  # (receiving stage, mb) -> gradient bytes, same rank
    act = recv = held = 0
    best = (0, 0, 0)

    def check() -> None:
        nonlocal best
        if act + recv + held > sum(best):
            best = (act, recv, held)

    for i, action in enumerate(stream):
        for j in posted_before.get(i, ()):
            r = stream[j]
            size = sent[r.stage - 1] if r.kind is Kind.RECV_F else grads[r.stage]
            receiving[(r.kind, r.stage, r.microbatch)] = size
            recv += size
        check()
        kind, s, mb = action.kind, action.stage, action.microbatch
        if kind is Kind.F:
            recv -= receiving.pop((Kind.RECV_F, s, mb), 0)
            act += memory[s]
        elif kind in (Kind.B, Kind.I):
            act -= memory[s] if kind is Kind.B else memory[s] - kept[s]
            recv -= receiving.pop((Kind.RECV_B, s, mb), 0)
            held -= handed.pop((s, mb), 0)
            if (s, mb) in sends_forward:
                held += sent[s]
            if (s, mb) in sends_backward:
                held += grads[s - 1]
            elif s > 0 and stage_to_rank[s - 1] == rank:
                handed[(s - 1, mb)] = grads[s - 1]
                held += grads[s - 1]
        elif kind is Kind.W:
            act -= kept[s]
        act += shared.get(i, 0)
        check()
    return best
