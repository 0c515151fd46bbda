"""The executor: walks one rank's lowered stream action by action, on torch.distributed P2P.

No schedule logic lives here: the order of everything comes from `Program.streams`.
Per action:

- RECV posts a non-blocking receive; the compute action that consumes it waits for it
  (the lowering puts each RECV right before its consumer, so the RECV's row in the
  timeline is the time the rank waited for the data; on NCCL the GPU stream waits, not
  the host, and the step's end checks every transfer against the timeout). With `post_ahead` k > 0 the
  receive is posted k compute actions earlier than its RECV (at most k more receive
  buffers per rank), so the transfer can land while the rank computes; with "step"
  every receive of the step is posted at its start (one buffer per incoming transfer
  of the step). The RECV row still runs from reaching the RECV to the data being
  there. The order of compute and of sends is never changed.
- F / B / I / W run on the stage (see stage.py); an output headed for a stage on the
  same rank is handed over in memory, one headed elsewhere waits in a mailbox for
  its SEND.
- SEND posts a non-blocking send; it is completed before the step ends. Its row in
  the timeline runs from posting to delivery, i.e. the end of the matching RECV on the
  receiver (neither backend lets a sender observe delivery without blocking).
- REDUCE_GRAD (data parallelism, `runtime.data_parallel`) launches the asynchronous
  all-reduce of its stage's gradients on the rank's dp group; every one is waited for
  before the step ends. Its row runs from the launch to the first time the rank saw it
  complete (checked after each action; on NCCL: when waited for at the step's end).

With a `runtime.layout.Layout` of dp x tp pipelines, every pipeline runs the same
streams: the stream's rank is the pipeline rank, peers are the global ranks of the same
pipeline, and each dp replica takes its equal share of the batch.

A step is the forward and backward of every microbatch of one batch: gradients are
zeroed before it and hold the full-batch gradient after it; no optimizer runs. Call
`execute` on every rank of an initialised process group; it may be called many times
in one group (tests run a whole matrix of configurations this way).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import Tensor

from schedules import Kind, Program
from schedules.analysis import split_forwards
from schedules.ir import Transfer
from schedules.lowering import insert_grad_reductions
from schedules.validate import check_program
from schedules.posting import STEP, PostAhead, post_positions, posting_plan
from schedules.stages import role_of

from . import reference
from .allocator import FreedMemory, configure as configure_allocator
from .clock import clock_for, host_clock_id
from .comm import TRANSPORTS, Transport, check_boundary, decode_meta, encode_meta, reason
from .data_parallel import GradReducer
from .errors import ConfigError, PeerError
from .layout import Layout, device_mesh
from .memory import SavedTensorMeter
from .models import PipelineModel, microbatch_sizes, partition
from .record import RunResult, gather
from .stage import Stage
from .tensor_parallel import (
    apply_tensor_parallel, check_tensor_parallel, collective_failure, full_gradients, local_numel,
)

POST_AHEAD_NAMES = ("auto", STEP)


@dataclass(frozen=True)
class RunOptions:
    """How to run: measured steps after warm-up steps, the peer timeout, --check, the split.

    `transport` None picks "ordered" on NCCL and "tagged" otherwise (see comm.py);
    `post_ahead` posts each receive that many compute actions before its RECV (0: at
    it), or, with "step", every receive of a step at the step's start. "auto" (the
    default) is "step" on gloo and 1 on NCCL. gloo moves a payload only once its
    receive is posted: a send that finds it posted is written by the calling thread at
    once, a send that does not waits for gloo's event-loop threads, which on a busy CPU
    wait for a free core; posting every receive first makes every send the first kind
    and takes the posting (and its lock) out of the step's critical path. Receive
    buffers are host memory there; on NCCL each early receive holds device memory, so
    the default looks one compute action ahead.
    """

    steps: int = 1
    warmup: int = 0
    timeout: float = 300.0
    check: bool = False
    tolerance: float = reference.TOLERANCE
    split: tuple[int, ...] | None = None
    transport: str | None = None
    post_ahead: int | str = "auto"
    layout: Layout | None = None  # None: every rank is a pipeline rank (pp = world size)
    freed_memory: FreedMemory = FreedMemory.KEEP  # on CPU, what malloc does with freed blocks (runtime.allocator)

    def validate(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"--steps must be at least 1; got {self.steps!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"--warmup must be 0 or more; got {self.warmup!r}")
        if not self.timeout > 0:
            raise ConfigError(f"--timeout must be positive seconds; got {self.timeout!r}")
        if self.post_ahead not in POST_AHEAD_NAMES and (
            not isinstance(self.post_ahead, int) or isinstance(self.post_ahead, bool) or self.post_ahead < 0
        ):
            raise ConfigError(
                f"--post-ahead must be 0 or more compute actions, 'step' or 'auto'; got {self.post_ahead!r}"
            )
        if not isinstance(self.freed_memory, FreedMemory):
            raise ConfigError(f"--freed-memory must be one of {', '.join(f.value for f in FreedMemory)}; "
                              f"got {self.freed_memory!r}")
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}; got {self.transport!r}")

    def resolved_post_ahead(self, backend: str) -> int | str:
        """`post_ahead` with "auto" replaced by the backend's default ("step" or 1)."""
        if self.post_ahead == "auto":
            return 1 if backend == "nccl" else STEP
        return self.post_ahead


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything about a run that is decided before any communication."""

    program: Program
    model: PipelineModel
    options: RunOptions
    layers: tuple[range, ...]  # per stage
    sizes: tuple[int, ...]  # rows per microbatch (of one data-parallel replica's share)
    layout: Layout


def prepare(program: Program, model: PipelineModel, options: RunOptions, world_size: int) -> Plan:
    """Check that program, model, options and world size fit together; raises ConfigError."""
    options.validate()
    schedule = program.schedule
    layout = options.layout or Layout(world_size)
    if layout.size != world_size:
        raise ConfigError(f"the layout {layout.describe()} has {layout.size} ranks but the world has {world_size}")
    if layout.pp != schedule.ranks and layout.size == layout.pp:
        raise ConfigError(
            f"the schedule {schedule.describe()} needs {schedule.ranks} ranks but the world has {world_size} "
            f"(launch with torchrun --nproc-per-node {schedule.ranks}, or that many ranks across nodes)"
        )
    if layout.pp != schedule.ranks:
        raise ConfigError(
            f"the schedule {schedule.describe()} needs {schedule.ranks} pipeline ranks but the layout has "
            f"pp={layout.pp} ({layout.describe()}; launch pp x dp x tp = {schedule.ranks * layout.dp * layout.tp} "
            "ranks with torchrun, or give --pp)"
        )
    check_tensor_parallel(model, layout.tp)
    if model.batch_size % layout.dp:
        raise ConfigError(
            f"--batch-size {model.batch_size} is not divisible by --dp {layout.dp}: every replica takes an equal share"
        )
    if layout.dp > 1 and not any(a.kind is Kind.REDUCE_GRAD for stream in program.streams for a in stream):
        program = insert_grad_reductions(program)  # a program file lowered without data parallelism
        check_program(program)
    layers = partition(len(model.layers), schedule.num_stages, options.split)
    sizes = microbatch_sizes(model.batch_size // layout.dp, schedule.microbatches)
    return Plan(program, model, options, layers, tuple(sizes), layout)


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def execute(
    program: Program,
    model: PipelineModel,
    options: RunOptions = RunOptions(),
    device: torch.device | None = None,
    on_ready: Callable[[], None] | None = None,
) -> RunResult:
    """Run `options.warmup + options.steps` steps of `program` on this rank; collective.

    `on_ready` is called once the ranks have agreed on the boundary shapes, just before
    the first step (the CLI prints a line there).
    """
    with Session(program, model, options, device) as session:
        if on_ready is not None:
            on_ready()
        for _ in range(options.warmup):
            session.step(measured=False)
        for _ in range(options.steps):
            session.step()
        return session.finish()


class Session:
    """A run held open on this rank: `step()` as often as wanted, then `finish()`; collective.

    Every rank makes the same calls in the same order. Construction checks the
    configuration, computes the --check reference and agrees on boundary shapes; a step
    with `measured=False` is a warm-up step, run but not recorded. Between steps the
    parameters' gradients hold the last step's full-batch gradient (an optimizer may use
    them). `options.steps` and `options.warmup` are only read by `execute`.
    """

    def __init__(
        self, program: Program, model: PipelineModel, options: RunOptions = RunOptions(),
        device: torch.device | None = None,
    ):
        self.plan = prepare(program, model, options, dist.get_world_size())
        self.device = default_device() if device is None else device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # object collectives on NCCL use the current device
        self._reference = reference.compute(model, self.device) if options.check else None
        self._rank = _RankState(self.plan, self.device)
        self._closed = False
        try:
            self._rank.agree_shapes()
        except BaseException as exc:
            self.close(keep_groups=isinstance(exc, PeerError))
            raise

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """This rank's parameters (of its stages), named as in `PipelineModel.full_module()`."""
        return [(n, p) for stage in self._rank.stages.values() for n, p in stage.module.named_parameters()]

    def step(self, measured: bool = True) -> float:
        """One step on every rank; returns its wall time (barrier to barrier) in seconds."""
        return self._rank.step(len(self._rank.step_times) if measured else None)

    def finish(self) -> RunResult:
        """Gather every rank's records to rank 0 and end the run; rank 0's result has them all."""
        state = self._rank
        if not state.step_times:
            raise ValueError("finish() needs at least one measured step")
        try:
            payload = state.payload(self._reference)
        finally:
            self.close()
        first = state.global_rank == 0
        gathered = [None] * dist.get_world_size() if first else None
        dist.gather_object(payload, gathered, dst=0)
        result = gather(self.plan, gathered, state.backend, self.device) if first else None
        verdict = [None if result is None else result.passed]
        dist.broadcast_object_list(verdict, src=0)
        return result if result is not None else RunResult(rank=state.global_rank, passed=verdict[0])

    def close(self, keep_groups: bool = False) -> None:
        """Give the modules back their own forward and drop this run's groups (idempotent).

        `keep_groups` leaves the groups alone: after a peer failed, destroying a group
        with receives still posted to the dead peer can block until they time out, so
        the caller could not report the failure before a launcher stops it.
        """
        if not self._closed:
            self._closed = True
            self._rank.close(keep_groups)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.close(keep_groups=exc_type is not None and issubclass(exc_type, PeerError))


@dataclass(frozen=True, slots=True)
class Receive:
    """One receive to post: its transfer, from rank `peer`, into a buffer of `shape` and
    `dtype`; `recv_position` is its RECV's stream position (its row ends when the data is
    waited for), `label` names the RECV in errors."""

    transfer: Transfer
    peer: int
    shape: torch.Size
    dtype: torch.dtype
    recv_position: int
    label: str


@dataclass(frozen=True, slots=True, eq=False)
class ComputeOp:
    """Run `kind` of `microbatch` on `stage` (stream position `position`): its input is the data
    of transfer `consumes` (None: the batch, or nothing for W), its output that of `produces`
    (None: nothing to hand on); `split` marks a forward whose backward is split into I and W."""

    position: int
    kind: Kind
    stage: Stage
    microbatch: int
    consumes: Transfer | None
    produces: Transfer | None
    split: bool


@dataclass(frozen=True, slots=True)
class SendOp:
    """Post the send of `transfer` to rank `peer` (stream position `position`, `label` its SEND)."""

    position: int
    transfer: Transfer
    peer: int
    label: str


@dataclass(frozen=True, slots=True)
class ReduceOp:
    """Launch the gradient all-reduce of `stage` (stream position `position`, `label` its REDUCE_GRAD)."""

    position: int
    stage: Stage
    label: str


@dataclass(frozen=True, slots=True)
class PostOp:
    """Post `receives`; `at_recv` when this is the RECV at `position` itself (its row starts
    here), else the receives are posted ahead of their RECVs."""

    position: int
    receives: tuple[Receive, ...]
    at_recv: bool


Op = ComputeOp | SendOp | PostOp | ReduceOp


@dataclass
class _Pending:
    """A posted receive: its work and buffer, and what it was posted for."""

    work: Any
    buffer: Tensor
    receive: Receive


@dataclass
class _StepLog:
    """Raw stamps of one measured step, resolved to seconds after the step."""

    starts: list = field(default_factory=list)
    ends: list = field(default_factory=list)
    mem_before: list = field(default_factory=list)
    mem_after: list = field(default_factory=list)
    cuda_after: list | None = None  # torch.cuda.memory_allocated after each compute action
    cpu: list = field(default_factory=list)  # thread CPU ns of each compute action (0 for the others)


class _RankState:
    """The per-rank state of one run: stages, transport, compiled stream, records."""

    def __init__(self, plan: Plan, device: torch.device):
        self.plan = plan
        self.device = device
        # Before the first activation: whether freed blocks stay with the process (runtime.allocator).
        self.freed_memory = configure_allocator(plan.options.freed_memory) if device.type == "cpu" else None
        # `rank` is this process's pipeline rank (its stream); `global_rank` its place in the world.
        self.global_rank = dist.get_rank()
        self.coords = plan.layout.coords(self.global_rank)
        self.rank = self.coords.pp
        self.peers = plan.layout.pipeline(self.global_rank)  # pipeline rank -> global rank
        self.backend = dist.get_backend()
        program = plan.program
        schedule = program.schedule
        self.schedule = schedule
        self.stream = program.streams[self.rank]
        options = plan.options
        model = plan.model
        num_stages = schedule.num_stages
        self.local = schedule.rank_stages[self.rank]
        m = schedule.microbatches

        # This replica's equal share of the batch (all of it without data parallelism).
        share = model.batch_size // plan.layout.dp
        rows = slice(self.coords.dp * share, (self.coords.dp + 1) * share)
        inputs = model.inputs[rows].to(device)
        targets = model.targets[rows].to(device)
        self.inputs = list(torch.tensor_split(inputs, m))
        weights = [n / share for n in plan.sizes]
        split_stages = {a.stage for a in self.stream if a.kind is Kind.I}
        roles = {s: role_of(s, num_stages) for s in self.local}
        modules = {
            s: model.stage_module(plan.layers[s], roles[s].holds_prologue, roles[s].holds_epilogue).to(device)
            for s in self.local
        }
        # The layout's mesh (collective: every rank builds it, before the transport's groups).
        self.mesh = device_mesh(plan.layout, device.type, options.timeout) if plan.layout.size > plan.layout.pp else None
        self.tp_ranks = plan.layout.tp_group(self.global_rank)
        if plan.layout.tp > 1:
            modules = {s: apply_tensor_parallel(mod, self.mesh["tp"]) for s, mod in modules.items()}
        params = [p for mod in modules.values() for p in mod.parameters()]
        self.meter = SavedTensorMeter([*params, inputs, targets])
        self.stages: dict[int, Stage] = {}
        for s, module in modules.items():
            last = roles[s].holds_epilogue
            self.stages[s] = Stage(
                s, module, self.meter,
                loss=model.loss if last else None,
                targets=list(torch.tensor_split(targets, m)) if last else None,
                weights=weights if last else None,
                split=s in split_stages,
            )
        kind = options.transport or ("ordered" if self.backend == "nccl" else "tagged")
        layout = plan.layout
        self.reducer = GradReducer(
            self.mesh["dp"].get_group() if layout.dp > 1 else None, layout.dp_group(self.global_rank),
            self.global_rank, options.timeout, stream_ordered=self.backend == "nccl",
        )
        self.transport = Transport(program, self.global_rank, options.timeout, kind, layout)
        self.clock = clock_for(device)
        self.shapes: dict[int, tuple[torch.Size, torch.dtype]] = {}  # boundary s->s+1: shape of mb 0
        self.logs: list[_StepLog] = []
        self.origins: list[int | None] = []  # each measured step's start on the host clock (runtime.clock)
        self.step_times: list[float] = []
        self.process_cpu: list[float] = []  # the process's CPU seconds (every thread) over each measured step's stream
        self.warmup_steps = 0
        self.peaks: list[int] = []
        self.cuda_peaks: list[int] = []
        self.losses: list[float] = []
        self.ops: list[Op] = []

    # ----------------------------------------------------------------- setup

    def agree_shapes(self) -> None:
        """Learn every incoming boundary's shape once: stage by stage, a no-grad forward.

        The owner of stage s runs it on microbatch 0's shape and tells the owner of s+1.
        A failure travels down the chain as a status, then all ranks learn it together.
        """
        s2r = self.schedule.stage_to_rank
        num_stages = self.schedule.num_stages
        rows = self.plan.sizes[0]
        error: str | None = None
        carried: Tensor | None = None
        for s in range(num_stages):
            if s2r[s] != self.rank:
                continue
            if s == 0:
                x = self.inputs[0]
            elif s2r[s - 1] == self.rank:
                x = carried
            else:
                status, shape, dtype = decode_meta(
                    self.transport.recv_meta(self.peers[s2r[s - 1]], self.device, f"the shape of stage {s - 1}'s output")
                )
                if status:
                    error = error or f"stage {s - 1} (rank {self.peers[s2r[s - 1]]}) failed its shape check"
                    x = None
                else:
                    self.shapes[s - 1] = (shape, dtype)
                    x = torch.zeros(shape, dtype=dtype, device=self.device)
            y = None
            if error is None:
                stage = self.stages[s]
                try:
                    with torch.no_grad():
                        y = stage.module(x)
                        if stage.is_last:
                            loss = stage.loss(y, stage.targets[0])
                            if not isinstance(loss, Tensor) or loss.numel() != 1:
                                error = f"the loss returns {type(loss).__name__} {getattr(loss, 'shape', '')}, not a scalar"
                        else:
                            error = check_boundary(y, s, rows)
                except Exception as exc:  # a user model's own error, reported as one line
                    error = f"stage {s} fails on a microbatch of {rows} rows: {type(exc).__name__}: {exc}"
                if error is None and not stage.is_last:
                    self.shapes[s] = (y.shape, y.dtype)
            if s + 1 < num_stages:
                if s2r[s + 1] == self.rank:
                    carried = y
                else:
                    meta = encode_meta(y if error is None else None, 1 if error else 0, self.device)
                    self.transport.send_meta(meta, self.peers[s2r[s + 1]], f"sending the shape of stage {s}'s output")
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise ConfigError(first)
        self._compile()

    def _compile(self) -> None:
        """The stream as named ops the step loop can run without looking anything up."""
        s2r = self.schedule.stage_to_rank
        num_stages = self.schedule.num_stages
        split = split_forwards(self.stream)
        plan = posting_plan(self.plan.program, self.rank) if self.transport.kind == "ordered" else {}
        recv_at = {a.transfer: i for i, a in enumerate(self.stream) if a.kind.is_recv}
        ahead = PostAhead.parse(self.plan.options.resolved_post_ahead(self.backend))
        early: dict[int, list[int]] = {}  # stream position -> RECV positions whose receives are posted before it
        if not ahead.at_recv:
            for recv, at in post_positions(self.stream, ahead).items():
                early.setdefault(at, []).append(recv)

        def receives(position: int) -> tuple[Receive, ...]:
            """What to post for the RECV at `position`: its transfer, or the ordered transport's plan."""
            transfers = plan.get(position, (self.stream[position].transfer,))
            return tuple(
                Receive(t, self.peers[s2r[t.sender]], *self._buffer_shape(t), recv_at[t], str(t.recv()))
                for t in transfers
            )

        ops: list[Op] = []
        for i, a in enumerate(self.stream):
            for j in early.get(i, ()):
                ops.append(PostOp(j, receives(j), at_recv=False))
            if a.kind.is_compute:
                ops.append(ComputeOp(i, a.kind, self.stages[a.stage], a.microbatch, a.consumes(num_stages),
                                     a.produces(num_stages), split[i]))
            elif a.kind.is_send:
                ops.append(SendOp(i, a.transfer, self.peers[s2r[a.transfer.receiver]], str(a)))
            elif a.kind is Kind.REDUCE_GRAD:
                ops.append(ReduceOp(i, self.stages[a.stage], str(a)))
            else:
                ops.append(PostOp(i, receives(i) if ahead.at_recv else (), at_recv=True))
        self.ops = ops
        self.static_rows = [
            (self.rank, a.stage, self.schedule.chunk_of(a.stage), a.microbatch, a.kind.value, str(a),
             s2r[a.peer_stage()] if a.kind.is_comm else -1)
            for a in self.stream
        ]

    def _buffer_shape(self, transfer: Transfer) -> tuple[torch.Size, torch.dtype]:
        """Shape and dtype of `transfer`: its boundary's, with its microbatch's rows."""
        shape, dtype = self.shapes[transfer.boundary]
        return torch.Size((self.plan.sizes[transfer.microbatch], *shape[1:])), dtype

    # ------------------------------------------------------------------ step

    def _barrier(self, where: str) -> None:
        try:
            if self.backend == "nccl":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()
        except RuntimeError as exc:
            raise PeerError(f"rank {self.global_rank}: barrier {where} failed: {reason(exc, -1, self.plan.options.timeout)}") from None

    def step(self, measured: int | None) -> float:
        """One step (forward and backward of every microbatch); `measured` is its index, None
        for a warm-up step. Returns the wall time from the barrier before to the one after."""
        for stage in self.stages.values():
            stage.zero_grad()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.meter.reset_peak()
        label = "a warm-up step" if measured is None else f"measured step {measured}"
        self._barrier(f"before {label}")
        if cuda:
            torch.cuda.synchronize(self.device)
        wall0 = time.perf_counter_ns()
        cpu0 = time.process_time_ns()
        log = self._run_stream()
        cpu = time.process_time_ns() - cpu0
        if cuda:
            torch.cuda.synchronize(self.device)
        self._barrier(f"after {label}")
        wall = (time.perf_counter_ns() - wall0) / 1e9
        if measured is None:
            self.warmup_steps += 1
            return wall
        self.clock.finish()
        seconds = self.clock.seconds
        log.starts = [seconds(t) for t in log.starts]
        log.ends = [seconds(t) for t in log.ends]
        self.logs.append(log)
        self.origins.append(self.clock.origin())
        self.step_times.append(wall)
        self.process_cpu.append(cpu / 1e9)
        self.peaks.append(self.meter.peak)
        self.cuda_peaks.append(torch.cuda.max_memory_allocated(self.device) if cuda else 0)
        last = self.stages.get(self.schedule.num_stages - 1)
        if last is not None:
            self.losses.append(float(last.loss_sum))
        return wall

    def _run_stream(self) -> _StepLog:
        n = len(self.stream)
        starts = [0] * n
        ends = [0] * n
        before = [0] * n
        after = [0] * n
        meter = self.meter
        transport = self.transport
        device = self.device
        cuda_after = [0] * n if device.type == "cuda" else None
        # An action's own CPU time: where ranks share cores, what it cost on a core, however
        # long the operating system kept it waiting for one (README, "Ranks sharing cores").
        cpu = [0] * n
        thread_cpu = time.thread_time_ns
        stamp = self.clock.stamp
        inputs = self.inputs
        reducer = self.reducer
        mailbox: dict = {}
        pending: dict = {}
        sends: list = []
        self.clock.begin()
        for op in self.ops:
            if type(op) is PostOp:
                if op.at_recv:
                    starts[op.position] = stamp()
                for receive in op.receives:
                    buffer = torch.empty(receive.shape, dtype=receive.dtype, device=device)
                    pending[receive.transfer] = _Pending(
                        transport.irecv(buffer, receive.peer, receive.transfer), buffer, receive)
                continue
            i = op.position
            if type(op) is SendOp:
                # A send's end is its delivery, read from the receiver's RECV (record.py):
                # gloo reports a send complete only once waited on, NCCL only from its stream.
                starts[i] = ends[i] = stamp()
                tensor = mailbox.pop(op.transfer)
                sends.append((transport.isend(tensor, op.peer, op.transfer), tensor, op.peer, op.label))
                continue
            if type(op) is ReduceOp:
                starts[i] = stamp()
                reducer.launch(i, op.label, op.stage.params)
                continue
            x = None
            if op.consumes is not None:
                recv = pending.pop(op.consumes, None)
                if recv is None:
                    x = mailbox.pop(op.consumes)
                else:
                    transport.consume(recv.work, recv.receive.label, recv.receive.peer)
                    ends[recv.receive.recv_position] = stamp()
                    x = recv.buffer
            before[i] = meter.bytes
            starts[i] = stamp()
            cpu_start = thread_cpu()
            kind, stage, mb = op.kind, op.stage, op.microbatch
            try:
                if kind is Kind.F:
                    out = stage.forward(mb, inputs[mb] if x is None else x, op.split)
                elif kind is Kind.B:
                    out = stage.backward(mb, x)
                elif kind is Kind.I:
                    out = stage.backward_input(mb, x)
                else:
                    out = stage.backward_weight(mb)
            except RuntimeError as exc:  # a tp peer failed inside the action's collectives
                failure = collective_failure(exc, self.global_rank, str(self.stream[i]), self.tp_ranks,
                                             self.plan.options.timeout)
                if failure is None:
                    raise
                raise failure from None
            if op.produces is not None:
                mailbox[op.produces] = out
            ends[i] = stamp()
            cpu[i] = thread_cpu() - cpu_start
            after[i] = meter.bytes
            if cuda_after is not None:
                cuda_after[i] = torch.cuda.memory_allocated(device)
            if reducer.in_flight:
                reducer.poll(ends, stamp)
        reducer.settle(ends, stamp)
        transport.settle([(work, text, peer) for work, _, peer, text in sends])
        if mailbox or pending:
            left = sorted(str(k) for k in (*mailbox, *pending))
            raise RuntimeError(f"rank {self.global_rank}: step ended with undelivered transfers {left}")
        return _StepLog(starts, ends, before, after, cuda_after, cpu)

    # --------------------------------------------------------------- results

    def payload(self, ref: reference.Reference | None) -> dict[str, Any]:
        """What this rank sends to rank 0: its rows, times, memory and check errors."""
        timeline, memory, cuda_memory, cpu = [], [], [], []
        compute = [i for i, a in enumerate(self.stream) if a.kind.is_compute]
        for step, log in enumerate(self.logs):
            for i, static in enumerate(self.static_rows):
                timeline.append((step, *static, log.starts[i], log.ends[i]))
            cpu += [(step, self.rank, str(self.stream[i]), log.cpu[i] / 1e9) for i in compute]
            memory.append((step, self.rank, 0.0, log.mem_before[compute[0]] if compute else 0))
            for i in compute:
                memory.append((step, self.rank, log.ends[i], log.mem_after[i]))
                if log.cuda_after is not None:
                    cuda_memory.append((step, self.rank, log.ends[i], log.cuda_after[i]))
        stats: dict[int, dict[str, list[float]]] = {s: {} for s in self.local}
        for log in self.logs:
            saved: dict[tuple[int, int], int] = {}
            for i in compute:
                a = self.stream[i]
                entry = stats[a.stage]
                entry.setdefault(a.kind.value, []).append(log.ends[i] - log.starts[i])
                delta = log.mem_after[i] - log.mem_before[i]
                if a.kind is Kind.F:
                    saved[(a.stage, a.microbatch)] = delta
                    entry.setdefault("activation_bytes", []).append(delta)
                elif a.kind is Kind.I:
                    entry.setdefault("weight_grad_bytes", []).append(saved[(a.stage, a.microbatch)] + delta)
        stage_stats = {s: {k: median(v) for k, v in kinds.items()} for s, kinds in stats.items()}
        check = None
        if ref is not None:
            errors = {}
            for stage in self.stages.values():  # tp shards gathered whole (collective over tp)
                for name, grad in full_gradients(stage.module).items():
                    errors[name] = reference.relative_error(grad, ref.grads[name])
            # Replicas must end a step with the same gradients, bit for bit (one all-reduce
            # result); under tp each rank digests its own shard, compared with its replicas'.
            digest = hashlib.sha256()
            for _, p in self.named_parameters_sorted():
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                grad = grad.to_local() if hasattr(grad, "to_local") else grad
                digest.update(grad.detach().cpu().numpy().tobytes())
            check = {"errors": errors, "reference_loss": ref.loss, "names": sorted(ref.grads),
                     "grad_digest": digest.hexdigest()}
        return {
            "rank": self.rank,
            "global_rank": self.global_rank,
            "coords": tuple(self.coords),
            "timeline": timeline,
            "memory": memory,
            "cuda_memory": cuda_memory,
            "cpu": cpu,
            "process_cpu": self.process_cpu,
            "origins": self.origins,
            "clock_id": host_clock_id(),
            "step_times": self.step_times,
            "warmup_steps": self.warmup_steps,
            "peak_bytes": max(self.peaks),
            "peak_cuda_bytes": max(self.cuda_peaks) if self.device.type == "cuda" else None,
            "loss": self.losses[-1] if self.losses else None,
            "stages": stage_stats,
            "boundaries": {
                s: int(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size())
                for s, (shape, dtype) in self.shapes.items()
                if s in self.local
            },
            "params": {s: local_numel(st.module) for s, st in self.stages.items()},  # this rank's tp shard
            "param_bytes": {s: local_numel(st.module, bytes=True) for s, st in self.stages.items()},
            "batch_bytes": self.plan.model.inputs.nbytes + self.plan.model.targets.nbytes,
            "freed_memory": self.freed_memory,
            "check": check,
        }

    def named_parameters_sorted(self) -> list[tuple[str, torch.nn.Parameter]]:
        return sorted((n, p) for stage in self.stages.values() for n, p in stage.module.named_parameters())

    def close(self, keep_groups: bool = False) -> None:
        for stage in self.stages.values():
            stage.close()
        if not keep_groups:
            self.transport.close()
