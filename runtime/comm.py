"""Point-to-point transfers between stages on torch.distributed: tags, groups, waits with a timeout.

A transfer is named by the IR (`schedules.ir.Transfer`: direction, sending stage,
microbatch); both ends read the same one from their action (`Action.transfer`), and its
dense number (`Transfer.number`) is the message tag.

Both transports open one two-rank process group per direction of each communicating
pair, so traffic A->B never shares a connection, a lock or a stream with B->A. Peers
are global ranks: the caller maps the schedule's (pipeline) ranks to the global ranks of
its pipeline with `runtime.layout.Layout.pipeline`, and every pipeline of the layout
(one per dp and tp coordinate) gets its own pairs. On gloo
this matters: its TCP transport has one connection per rank pair and group, carrying
both directions, whose event-loop thread holds the pair's lock while it moves a payload
and whose isend/irecv calls take the same lock (gloo/transport/tcp/pair.cc).

- ``tagged`` (gloo): each transfer carries a tag made from its key, so a receive
  matches its send whatever order either side posts them in.
- ``ordered`` (NCCL, which ignores tags and matches in posting order): a receive is
  posted, together with every earlier transfer of the same sender->receiver direction
  not yet posted, in the sender's order (`schedules.posting.posting_plan`), so posting
  order always agrees with the sender's.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
from torch import Tensor

from schedules import Program
from schedules.ir import Transfer, transfer_count

from .errors import PeerError
from .layout import Layout

TRANSPORTS = ("tagged", "ordered")

# Dtypes a stage boundary may carry, by their code in the shape message.
DTYPES = (
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
)
MAX_DIMS = 8
META_LEN = 3 + MAX_DIMS  # status, dtype code, ndim, dims


def directed_pairs(program: Program) -> list[tuple[int, int]]:
    """(sender, receiver) rank pairs that carry at least one transfer, sorted."""
    s2r = program.schedule.stage_to_rank
    pairs = {
        (rank, s2r[a.transfer.receiver])
        for rank, stream in enumerate(program.streams)
        for a in stream
        if a.kind.is_send
    }
    return sorted(pairs)


class Transport:
    """Posts sends and receives for one rank and waits on them with a timeout."""

    def __init__(self, program: Program, rank: int, timeout: float, kind: str, layout: Layout | None = None):
        """`rank` is this process's global rank; `layout` None means a pipeline-only world."""
        if kind not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}; got {kind!r}")
        layout = layout or Layout(program.schedule.ranks)
        self.rank = rank
        self.kind = kind
        self.timeout = timeout
        self._delta = datetime.timedelta(seconds=timeout)
        self._m = program.schedule.microbatches
        # Above every transfer's tag, so shape messages never match a transfer.
        self._meta_tag = transfer_count(program.schedule.num_stages, self._m)
        self._groups: dict[tuple[int, int], dist.ProcessGroup | None] = {}
        # On NCCL a wait with a timeout blocks the calling thread until the transfer is done,
        # polling every millisecond (ProcessGroupNCCL's WorkNCCL::wait); a wait without one
        # only makes the current CUDA stream wait. So receives are consumed stream-ordered
        # there and checked against the timeout at the step's end (`settle`).
        self.stream_ordered = dist.get_backend() == "nccl"
        self._consumed: list[tuple[dist.Work, str, int]] = []
        # new_group is collective over the world: every rank creates every group, in order
        # (pipeline by pipeline); keys are global (sender, receiver) ranks.
        for pipeline in layout.pipelines():
            for src, dst in directed_pairs(program):
                pair = (pipeline[src], pipeline[dst])
                group = dist.new_group(list(pair))
                if rank in pair:
                    self._groups[pair] = group

    def close(self) -> None:
        """Destroy the per-direction groups this run created (every rank calls this)."""
        for group in self._groups.values():
            dist.destroy_process_group(group)
        self._groups.clear()

    def isend(self, tensor: Tensor, dst: int, transfer: Transfer) -> dist.Work:
        """Post a send; a connection already closed by `dst` is a PeerError, like a failed wait."""
        try:
            return self._isend(tensor, dst, transfer.number(self._m))
        except RuntimeError as exc:
            raise self._peer_error(exc, str(transfer.send()), dst) from None

    def irecv(self, buffer: Tensor, src: int, transfer: Transfer) -> dist.Work:
        """Post a receive; a connection already closed by `src` is a PeerError."""
        try:
            return self._irecv(buffer, src, transfer.number(self._m))
        except RuntimeError as exc:
            raise self._peer_error(exc, str(transfer.recv()), src) from None

    def _peer_error(self, exc: RuntimeError, waiting_on: str, peer: int) -> PeerError:
        return PeerError(
            f"rank {self.rank}: gave up on {waiting_on} (peer rank {peer}): {reason(exc, peer, self.timeout)}"
        )

    def _isend(self, tensor: Tensor, dst: int, tag: int) -> dist.Work:
        return dist.isend(tensor, dst, group=self._groups.get((self.rank, dst)), tag=tag)

    def _irecv(self, buffer: Tensor, src: int, tag: int) -> dist.Work:
        return dist.irecv(buffer, src, group=self._groups.get((src, self.rank)), tag=tag)

    def wait(self, work: dist.Work, waiting_on: str, peer: int) -> None:
        """Complete `work` or raise PeerError naming this rank, `waiting_on` and the peer."""
        try:
            work.wait(timeout=self._delta)
        except RuntimeError as exc:  # DistBackendError and gloo's errors are RuntimeErrors
            raise self._peer_error(exc, waiting_on, peer) from None

    def consume(self, work: dist.Work, waiting_on: str, peer: int) -> None:
        """Make a posted receive's buffer usable by what runs next: on NCCL the current stream
        waits for it (the host goes on; `settle` checks it), elsewhere the host waits."""
        if self.stream_ordered:
            self._stream_wait(work, waiting_on, peer)
            self._consumed.append((work, waiting_on, peer))
        else:
            self.wait(work, waiting_on, peer)

    def settle(self, sends: list[tuple[dist.Work, str, int]]) -> None:
        """At a step's end: complete `sends` (work, what, peer) and every receive consumed
        stream-ordered, within the timeout, or raise PeerError naming the first one left."""
        if not self.stream_ordered:
            for work, waiting_on, peer in sends:
                self.wait(work, waiting_on, peer)
            return
        works, self._consumed = [*sends, *self._consumed], []
        deadline = time.monotonic() + self.timeout
        for work, waiting_on, peer in works:
            while not self._completed(work, waiting_on, peer):
                if time.monotonic() > deadline:
                    raise PeerError(
                        f"rank {self.rank}: gave up on {waiting_on} (peer rank {peer}): nothing arrived "
                        f"within the {self.timeout:g} s timeout (peer stopped or hung)"
                    )
                time.sleep(0)
            self._stream_wait(work, waiting_on, peer)  # raises what the transfer failed with, if it did

    def _stream_wait(self, work: dist.Work, waiting_on: str, peer: int) -> None:
        try:
            work.wait()
        except RuntimeError as exc:
            raise PeerError(
                f"rank {self.rank}: gave up on {waiting_on} (peer rank {peer}): {reason(exc, peer, self.timeout)}"
            ) from None

    def _completed(self, work: dist.Work, waiting_on: str, peer: int) -> bool:
        try:
            return work.is_completed()
        except RuntimeError as exc:
            raise PeerError(
                f"rank {self.rank}: gave up on {waiting_on} (peer rank {peer}): {reason(exc, peer, self.timeout)}"
            ) from None

    def send_meta(self, meta: Tensor, dst: int, waiting_on: str) -> None:
        self.wait(self._isend(meta, dst, self._meta_tag), waiting_on, dst)

    def recv_meta(self, src: int, device: torch.device, waiting_on: str) -> Tensor:
        meta = torch.empty(META_LEN, dtype=torch.int64, device=device)
        self.wait(self._irecv(meta, src, self._meta_tag), waiting_on, src)
        return meta.cpu()


def reason(exc: BaseException, peer: int, timeout: float) -> str:
    """A short cause for a failed wait, from the backend's message."""
    text = str(exc)
    lowered = text.lower()
    who = "a peer" if peer < 0 else f"rank {peer}"
    if "closed" in lowered or "reset" in lowered or "broken pipe" in lowered:
        return f"{who} closed the connection (it exited or died)"
    if "timed out" in lowered or "timeout" in lowered:
        return f"nothing arrived within the {timeout:g} s timeout (peer stopped or hung)"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def encode_meta(tensor: Tensor | None, status: int, device: torch.device) -> Tensor:
    """The shape message for a boundary tensor (status 1: upstream failed, no shape)."""
    meta = torch.zeros(META_LEN, dtype=torch.int64)
    meta[0] = status
    if tensor is not None:
        meta[1] = DTYPES.index(tensor.dtype)
        meta[2] = tensor.dim()
        meta[3 : 3 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    return meta.to(device)


def decode_meta(meta: Tensor) -> tuple[int, torch.Size, torch.dtype]:
    values = meta.tolist()
    ndim = values[2]
    return values[0], torch.Size(values[3 : 3 + ndim]), DTYPES[values[1]]


def check_boundary(tensor: object, stage: int, rows: int) -> str | None:
    """Why `tensor` cannot cross a stage boundary, or None if it can."""
    if not isinstance(tensor, Tensor):
        return f"stage {stage} returns {type(tensor).__name__}; a stage must return one tensor"
    if tensor.dtype not in DTYPES:
        return f"stage {stage} returns dtype {tensor.dtype}, which cannot be sent"
    if tensor.dim() == 0 or tensor.dim() > MAX_DIMS or tensor.shape[0] != rows:
        return (
            f"stage {stage} returns shape {tuple(tensor.shape)} for a microbatch of {rows} rows; "
            "stage outputs must keep the batch as their first dimension"
        )
    return None

