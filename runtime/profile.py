"""Profiles a run can add to its directory (profile.json), for calibrating the simulator.

- ``layers`` (``--profile-layers``): every rank, at the same time (so the two cores are as
  busy as during the steps), runs the executor's own `Stage` on one microbatch for each
  stage *role* (``first``: holds the model's prologue and gets no input gradient;
  ``middle``; ``last``: holds the epilogue and the loss; ``only``: both, for one stage)
  and each layer count in `LAYER_COUNTS`. Per (role, layer count) it records the
  durations in seconds of both ways the executor runs a stage, whichever the run used: F
  and B, and with split backward F (``F_split``: the forward that keeps what W needs,
  runtime.split), I and W, so that a run of either kind prices the other (at 1-8 rows per
  microbatch a split forward costs 1.05-1.20x a plain one); the run's own way says which
  bytes F leaves saved (``activation_bytes``) and, from one untimed split call, the
  bytes a split backward holds from I until W and what of the stage's input and output
  its activations hold (`_split_bytes`). These time stage
  calls exactly as the executor's timeline does, so fixed per-action costs (Python
  dispatch, hooks, the autograd engine's start) are in them; sim.calibration separates
  them from the per-layer cost by regression over the layer counts.
- ``p2p`` (``--profile-p2p``, two pipeline ranks or more): rank 0 and its next pipeline rank
  (`runtime.layout`) ping-pong tensors of `P2P_SIZES` bytes (and
  the run's boundary size) on the run's process group; one-way time = round trip / 2,
  measured on rank 0's clock alone (no cross-rank clock alignment involved).
- ``allreduce`` (``--profile-p2p`` with dp > 1): every dp group at once (as in a step)
  all-reduces float32 tensors of `P2P_SIZES` bytes; rank 0's wall time of each, for
  sim.calibration's all-reduce bandwidth.

Only rank 0 returns the gathered records; `write_profile` stores them next to the run's
summary.json.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from schedules import Kind
from schedules.ir import SPLIT_FORWARD
from schedules.stages import roles

from . import host
from .layout import Layout, device_mesh
from .memory import SavedTensorMeter
from .models import PipelineModel, microbatch_sizes
from .stage import Stage
from .tensor_parallel import apply_tensor_parallel

PROFILE = "profile.json"
LAYER_COUNTS = (1, 2, 4)
P2P_SIZES = (4, 65536, 1 << 20, 4 << 20)  # bytes
P2P_TAG = 1 << 30  # far above the run's transfer tags


def collect(program, model: PipelineModel, device: torch.device, layers: bool, p2p: bool,
            layout: Layout | None = None) -> dict[str, Any] | None:
    """The profiles asked for, at the run's microbatch size; collective, rank 0 gets them."""
    schedule = program.schedule
    layout = layout or Layout(dist.get_world_size())
    rows = microbatch_sizes(model.batch_size // layout.dp, schedule.microbatches)[0]
    split = any(a.kind is Kind.I for stream in program.streams for a in stream)
    out: dict[str, Any] = {}
    if layers:
        # Under tensor parallelism each tp group times its stages split as the run splits them.
        tp_mesh = device_mesh(layout, device.type)["tp"] if layout.tp > 1 else None
        out["layers"] = profile_layers(model, rows, device, split, schedule.num_stages, tp_mesh=tp_mesh)
    if p2p and layout.pp > 1:  # one pipeline rank has no peer to ping-pong with
        boundary = _boundary_input(model, model.inputs[:rows].to(device))
        out["p2p"] = profile_p2p(boundary.numel() * boundary.element_size(), device, peer=layout.rank_of(1))
    if p2p and layout.dp > 1:
        out["allreduce"] = profile_allreduce(layout, device)
    return out if dist.get_rank() == 0 else None


def profile_layers(
    model: PipelineModel, rows: int, device: torch.device, split: bool, num_stages: int,
    repeats: int = 10, warmup: int = 2, tp_mesh=None,
) -> dict[str, Any] | None:
    """Time stage calls of every role and layer count on this rank; collective, rank 0 gets all."""
    records = []
    inputs = model.inputs[:rows].to(device)
    targets = model.targets[:rows].to(device)
    hidden = _boundary_input(model, inputs)
    counts = [n for n in LAYER_COUNTS if n <= len(model.layers)]
    # A tp group times its calls together (they hold its collectives), so it never takes turns.
    turn, turns = profile_turns(device) if tp_mesh is None else (0, 1)
    for k in range(turns):
        if k == turn:
            for role in roles(num_stages):
                first, last = role.holds_prologue, role.holds_epilogue
                for n in counts:
                    records.append(
                        _profile_stage(model, range(n), first, last, inputs if first else hidden, targets, rows,
                                       device, split, repeats, warmup, tp_mesh)
                        | {"rank": dist.get_rank(), "role": role.value, "layers": n}
                    )
        if turns > 1:
            dist.barrier()
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(records, gathered, dst=0)
    if gathered is None:
        return None
    return {
        "rows": rows,
        "repeats": repeats,
        "warmup": warmup,
        "split": split,
        "records": [r for per_rank in gathered for r in per_rank],
    }


def profile_turns(device: torch.device) -> tuple[int, int]:
    """(this rank's turn, turns): on CPU hosts running more ranks than they have cores, the
    ranks of a host take turns, as many at a time as it has cores, so that each stage call is
    timed on a core of its own, as the calibration takes in-run actions (sim.calibration's
    full_speed); four ranks profiling at once on two cores gave per-kind run/profile speed
    ratios of 1.2-2.2 and layer slopes the runs did not have. Collective on CPU: every rank
    gets the most turns of any host; one turn elsewhere."""
    if device.type != "cpu":
        return 0, 1
    cores = host.cores()
    turn = host.local_rank(dist.get_rank()) // cores
    turns = torch.tensor([-(-host.local_world_size(dist.get_world_size()) // cores)])
    dist.all_reduce(turns, op=dist.ReduceOp.MAX)
    return turn, int(turns.item())


def _boundary_input(model: PipelineModel, inputs: torch.Tensor) -> torch.Tensor:
    """A tensor shaped like what crosses a stage boundary (the first layer's input)."""
    with torch.no_grad():
        x = inputs if model.prologue is None else model.prologue(inputs)
    generator = torch.Generator(device="cpu").manual_seed(0)
    return torch.randn(x.shape, generator=generator, dtype=x.dtype).to(x.device)


def _profile_stage(model, layers, first, last, x, targets, rows, device, split, repeats, warmup, tp_mesh=None) -> dict:
    module = model.stage_module(layers, first, last).to(device)
    if tp_mesh is not None:
        module = apply_tensor_parallel(module, tp_mesh)
    # As in the executor: parameters and the batch are not activations, a received input is.
    # On a GPU the batch here is a device copy (.to() returns the CPU tensor itself on CPU).
    batch = [x, targets] if first else [targets]
    meter = SavedTensorMeter([*module.parameters(), model.inputs, model.targets, *batch])

    def make_stage(split: bool) -> Stage:
        return Stage(
            0 if first else 1, module, meter,
            loss=model.loss if last else None,
            targets=[targets] if last else None,
            weights=[rows / model.batch_size] if last else None,
            split=split,
        )

    times: dict[str, list[float]] = {}
    saved = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for mode in (split, not split):  # the run's own way first, as the run warmed it
        stage = make_stage(mode)
        try:
            for i in range(warmup + repeats):
                before = meter.bytes
                sync()
                t0 = time.perf_counter_ns()
                out = stage.forward(0, x, mode)
                sync()
                t1 = time.perf_counter_ns()
                if mode == split:
                    saved.append(meter.bytes - before)
                grad = None if last else torch.ones_like(out)
                if mode:
                    stage.backward_input(0, grad)
                    sync()
                    t2 = time.perf_counter_ns()
                    stage.backward_weight(0)
                    sync()
                    t3 = time.perf_counter_ns()
                    stamps = {SPLIT_FORWARD: t1 - t0, "I": t2 - t1, "W": t3 - t2}
                else:
                    stage.backward(0, grad)
                    sync()
                    t2 = time.perf_counter_ns()
                    stamps = {"F": t1 - t0, "B": t2 - t1}
                if i >= warmup:
                    for k, ns in stamps.items():
                        times.setdefault(k, []).append(ns / 1e9)
        finally:
            stage.zero_grad()
            stage.close()
    # Byte counts do not vary between calls: one untimed split call says what a zero-bubble
    # schedule's I keeps for W (so that a 1F1B run prices that too) and what of the stage's
    # input and output its activations hold.
    return {**times, "activation_bytes": max(saved[warmup:]), **_split_bytes(make_stage(True), meter, x, last)}


def _split_bytes(stage: Stage, meter: SavedTensorMeter, x: torch.Tensor, last: bool) -> dict[str, int]:
    """What one split call of `stage` holds: from I until W in all (``weight_bytes``), and of
    its input's and its output's storages from F (``input_bytes``, ``output_bytes``) and from I
    until W (``input_weight_bytes``, ``output_weight_bytes``). A stage handed its input on the
    same rank (a V-shape's turn) shares that storage with the stage before it, whose output
    it is: sim.handover counts it once."""
    try:
        before = meter.bytes
        out = stage.forward(0, x, True)
        held = {"input_bytes": meter.held_bytes(x), "output_bytes": 0 if last else meter.held_bytes(out)}
        stage.backward_input(0, None if last else torch.ones_like(out))
        held |= {"weight_bytes": meter.bytes - before, "input_weight_bytes": meter.held_bytes(x),
                 "output_weight_bytes": 0 if last else meter.held_bytes(out)}
        stage.backward_weight(0)
    finally:
        stage.zero_grad()
        stage.close()
    return held


def profile_p2p(boundary_bytes: int | None, device: torch.device, repeats: int = 20, warmup: int = 3,
                peer: int = 1) -> dict | None:
    """Ping-pong between rank 0 and rank `peer` for each size; collective, rank 0 gets the record."""
    rank = dist.get_rank()
    sizes = sorted(set(P2P_SIZES) | ({boundary_bytes} if boundary_bytes else set()))
    one_way: dict[str, list[float]] = {}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if rank in (0, peer):
        peer = peer if rank == 0 else 0
        for size in sizes:
            buffer = torch.zeros(max(size // 4, 1), dtype=torch.float32, device=device)
            samples = []
            for i in range(warmup + repeats):
                t0 = time.perf_counter_ns()
                if rank == 0:
                    dist.isend(buffer, peer, tag=P2P_TAG).wait()
                    dist.irecv(buffer, peer, tag=P2P_TAG).wait()
                else:
                    dist.irecv(buffer, peer, tag=P2P_TAG).wait()
                    dist.isend(buffer, peer, tag=P2P_TAG).wait()
                sync()
                if i >= warmup:
                    samples.append((time.perf_counter_ns() - t0) / 2e9)
            one_way[str(buffer.numel() * 4)] = samples
    dist.barrier()
    if rank != 0:
        return None
    return {"repeats": repeats, "warmup": warmup, "one_way_seconds": one_way}


def profile_allreduce(layout: Layout, device: torch.device, repeats: int = 20, warmup: int = 3) -> dict | None:
    """All-reduce float32 tensors of each of `P2P_SIZES` bytes on every dp group at once;
    collective, rank 0 gets its wall times (seconds per all-reduce)."""
    rank = dist.get_rank()
    mine = None
    for pp in range(layout.pp):  # new_group is collective over the world: every rank makes every group
        for tp in range(layout.tp):
            ranks = [layout.rank_of(pp, d, tp) for d in range(layout.dp)]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine = group
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    seconds: dict[str, list[float]] = {}
    for size in P2P_SIZES:
        buffer = torch.zeros(max(size // 4, 1), dtype=torch.float32, device=device)
        samples = []
        for i in range(warmup + repeats):
            sync()
            t0 = time.perf_counter_ns()
            dist.all_reduce(buffer, group=mine)
            sync()
            if i >= warmup:
                samples.append((time.perf_counter_ns() - t0) / 1e9)
        seconds[str(buffer.numel() * 4)] = samples
    dist.barrier()
    return {"ranks": layout.dp, "repeats": repeats, "warmup": warmup, "seconds": seconds} if rank == 0 else None


def clear_profile(out: str | Path) -> None:
    """Remove a previous run's profile.json, so it is never read as this run's."""
    path = Path(out) / PROFILE
    if path.exists():
        path.unlink()


def write_profile(out: str | Path, profile: dict[str, Any]) -> None:
    """Write profile.json into the run directory, atomically (a reader never sees half of it)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=out, prefix=".profile.", suffix=".json")
    with os.fdopen(handle, "w") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out / PROFILE)
