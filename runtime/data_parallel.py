"""Data parallelism: each stage's gradients all-reduced over its dp group (REDUCE_GRAD).

Every replica of the pipeline (one per dp coordinate, `runtime.layout`) runs the same
streams on its own equal share of the batch, so after its last backward a stage holds the
gradient of its replica's mean loss. REDUCE_GRAD averages it over the replicas: the mean
over equal shares of their mean losses is the full batch's mean loss, so the result is the
full-batch gradient, bit-identical on every replica (one all-reduce result).

As torch's DistributedDataParallel does, gradients travel in buckets (flat buffers of at
most `BUCKET_BYTES`, DDP's default bucket_cap_mb of 25, filled from the stage's last
parameters back, the order backward produces them) with one asynchronous all-reduce each
(SUM, then divided by d: gloo has no AVG). REDUCE_GRAD only launches them, so they overlap
whatever the stream still runs (the rest of the pipeline's drain); `settle` waits for all
of them, within the timeout, before the step ends, and copies the averages back.

Under tensor parallelism a parameter is a DTensor sharded over the tp group: each rank
all-reduces its local shard with the same shard of the other replicas (its dp group
holds one rank per replica at the same tp coordinate), and gets a DTensor gradient back
with the parameter's placements.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from .comm import reason
from .errors import PeerError

BUCKET_BYTES = 25 * 2**20


def buckets(params: list[nn.Parameter], cap: int = BUCKET_BYTES) -> list[list[nn.Parameter]]:
    """`params` in reverse order, cut into runs of at most `cap` bytes (a larger tensor alone)."""
    out: list[list[nn.Parameter]] = []
    size = cap
    for p in reversed(params):
        nbytes = _local(p).numel() * p.element_size()
        if size + nbytes > cap:
            out.append([])
            size = 0
        out[-1].append(p)
        size += nbytes
    return out


@dataclass
class Reduction:
    """One REDUCE_GRAD in flight: its stream position, text, and per bucket (work, flat, params)."""

    position: int
    label: str
    parts: list[tuple[Any, Tensor, list[nn.Parameter]]] = field(default_factory=list)
    ended: bool = False


class GradReducer:
    """Launches and settles the REDUCE_GRADs of one rank on its dp group."""

    def __init__(self, group: dist.ProcessGroup | None, ranks: tuple[int, ...], rank: int, timeout: float,
                 stream_ordered: bool):
        self.group = group
        self.ranks = ranks  # global ranks of the dp group, by dp index
        self.rank = rank
        self.timeout = timeout
        self._delta = datetime.timedelta(seconds=timeout)
        # On NCCL a work is waited on stream-ordered; is_completed polls would block nothing
        # but report only the host's view, so ends are stamped once waited (see `settle`).
        self.stream_ordered = stream_ordered
        self.in_flight: list[Reduction] = []

    @property
    def size(self) -> int:
        return len(self.ranks)

    def launch(self, position: int, label: str, params: list[nn.Parameter]) -> None:
        """Start the all-reduce of `params`' gradients (a missing gradient counts as zeros)."""
        reduction = Reduction(position, label)
        if self.size > 1:
            for bucket in buckets(params):
                flat = torch.cat([
                    _local(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket
                ])
                try:
                    work = dist.all_reduce(flat, group=self.group, async_op=True)
                except RuntimeError as exc:
                    raise self._error(label, exc) from None
                reduction.parts.append((work, flat, bucket))
        self.in_flight.append(reduction)

    def poll(self, ends: list, stamp: Callable[[], Any]) -> None:
        """Stamp the end of every reduction found complete (host clock only)."""
        if self.stream_ordered:
            return
        for reduction in self.in_flight:
            if not reduction.ended and all(_done(work) for work, _, _ in reduction.parts):
                ends[reduction.position] = stamp()
                reduction.ended = True

    def settle(self, ends: list, stamp: Callable[[], Any]) -> None:
        """Wait for every reduction (PeerError naming rank, group and action past the
        timeout), stamp the ends not yet stamped, and write the averages into `.grad`."""
        for reduction in self.in_flight:
            for work, flat, bucket in reduction.parts:
                try:
                    if self.stream_ordered:
                        work.wait()
                    else:
                        work.wait(timeout=self._delta)
                except RuntimeError as exc:
                    raise self._error(reduction.label, exc) from None
                flat.div_(self.size)
                offset = 0
                for p in bucket:
                    local = _local(p)
                    n = local.numel()
                    grad = flat[offset:offset + n].view_as(local)
                    if isinstance(p, DTensor):
                        grad = DTensor.from_local(grad, p.device_mesh, p.placements, run_check=False)
                    p.grad = grad
                    offset += n
            if not reduction.ended:
                ends[reduction.position] = stamp()
        self.in_flight = []

    def _error(self, label: str, exc: BaseException) -> PeerError:
        return PeerError(
            f"rank {self.rank}: gave up on {label} (all-reduce on the dp group, ranks "
            f"{', '.join(map(str, self.ranks))}): {reason(exc, -1, self.timeout)}"
        )


def _done(work) -> bool:
    """Whether `work` has ended; one that failed counts as ended (`settle` raises its error)."""
    try:
        return work.is_completed()
    except RuntimeError:
        return True


def _local(tensor: Tensor) -> Tensor:
    """This rank's part of `tensor`: a DTensor's local shard, any other tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
