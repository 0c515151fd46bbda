"""Tensor parallelism inside a stage (runtime/tensor_parallel.py): the gpt blocks split across a
2-rank gloo "tp" mesh must give the loss and every gradient of one process running the whole
model, alone and inside the executor at (pp, dp, tp) = (1, 1, 2) and (2, 1, 2) for every
registered schedule; bad splits are refused before any communication; a dead or stopped tp
peer ends the run with one line."""

import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime import ConfigError, ModelSpec, build_model
from runtime.models import CausalSelfAttention
from runtime.tensor_parallel import check_tensor_parallel
from ranks import (assert_peer_failure_named, fail_rank_one, free_port, rank_env, sgd_against_one_process, spawn_ranks,
                   wait_ready)

torch.set_num_threads(1)

GPT = dict(model="gpt", layers=2, hidden=32, heads=4, seq_len=8, vocab=32, batch_size=4)
TP = 2


def _naive_attention(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Attention written out head by head, reading q, k, v of head h from rows
    [3h d, 3h d + d), [3h d + d, 3h d + 2d), [3h d + 2d, 3(h+1) d) of the fused weight."""
    batch, seq, hidden = x.shape
    d = hidden // attn.heads
    w, b = attn.qkv.weight, attn.qkv.bias
    mask = torch.ones(seq, seq, dtype=torch.bool).tril()
    heads = []
    for h in range(attn.heads):
        rows = [slice(3 * h * d + j * d, 3 * h * d + (j + 1) * d) for j in range(3)]
        q, k, v = (x @ w[r].T + b[r] for r in rows)
        scores = (q @ k.transpose(1, 2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
        heads.append(scores.softmax(-1) @ v)
    return F.linear(torch.cat(heads, dim=-1), attn.proj.weight, attn.proj.bias)


def test_fused_qkv_rows_are_laid_out_head_by_head():
    torch.manual_seed(0)
    attn = CausalSelfAttention(24, 3)
    x = torch.randn(2, 5, 24)
    torch.testing.assert_close(attn(x), _naive_attention(attn, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "spec, tp, message",
    [
        (dict(GPT, heads=4), 3, "--tp 3 does not divide --heads 4"),
        (dict(model="mlp", layers=2, hidden=8, batch_size=4), 2, "the mlp model runs with --tp 1 only"),
        (GPT, 0, "--tp must be a positive integer"),
    ],
)
def test_bad_splits_are_refused_in_one_line_without_a_process_group(spec, tp, message):
    import torch.distributed as dist

    assert not dist.is_initialized()  # nothing to communicate with: the check cannot communicate
    with pytest.raises(ConfigError, match=message) as info:
        check_tensor_parallel(build_model(ModelSpec(**spec)), tp)
    assert "\n" not in str(info.value)
    check_tensor_parallel(build_model(ModelSpec(**spec)), 1)  # t = 1 is always legal


def _executor_runs(layout, configs) -> list[dict]:
    """--check of each (schedule, m, chunks) on `layout` through runtime.execute; rank 0's verdicts."""
    import schedules
    from runtime import RunOptions, execute

    runs = []
    for name, m, chunks in configs:
        program = schedules.lower(schedules.build(name, ranks=layout.pp, microbatches=m, chunks=chunks), layout.dp)
        spec = ModelSpec(**dict(GPT, layers=program.schedule.num_stages, batch_size=layout.dp * (2 * m + 1)))
        result = execute(program, build_model(spec), RunOptions(check=True, timeout=60, layout=layout))
        if result.summary is not None:
            frame = result.timeline
            runs.append({"schedule": name, "passed": result.passed, "check": result.summary["check"],
                         "layout": result.summary["layout"], "rows": len(frame), "expected_rows": program.num_actions,
                         "params": [stage["params"] for stage in result.summary["stage_costs"]]})
    return runs


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from runtime import reference
    from runtime.layout import Layout
    from runtime.memory import SavedTensorMeter
    from runtime.stage import Stage
    from runtime.tensor_parallel import apply_tensor_parallel, full_gradients

    dist.init_process_group("gloo", rank=rank, world_size=TP, timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    model = build_model(ModelSpec(**GPT))
    want = reference.compute(model, torch.device("cpu"))
    results = {}
    for split in (False, True):  # one backward, and the zero-bubble split into I then W
        whole = model.stage_module(range(GPT["layers"]), True, True)
        module = apply_tensor_parallel(whole, mesh["tp"])
        qkv = module.layer0.attn.qkv.weight
        boundary = module.layer0(module.prologue(model.inputs))  # what a stage hands to P2P
        stage = Stage(0, module, SavedTensorMeter([]), loss=model.loss, targets=list(model.targets.tensor_split(2)),
                      weights=[0.5, 0.5], split=split)
        for mb, rows in enumerate(model.inputs.tensor_split(2)):
            stage.forward(mb, rows, split)
        for mb in range(2):
            if split:
                stage.backward_input(mb, None)
                stage.backward_weight(mb)
            else:
                stage.backward(mb, None)
        stage.close()
        got = full_gradients(module)
        results[str(split)] = {
            "loss": float(stage.loss_sum),
            "errors": {name: reference.relative_error(got.get(name), g) for name, g in want.grads.items()},
            "boundary_type": type(boundary).__name__,
            "boundary_shape": list(boundary.shape),
            "qkv_local_shape": list(qkv.to_local().shape) if isinstance(qkv, DTensor) else None,
            "qkv_local_rows": qkv.to_local()[:, 0].tolist() if isinstance(qkv, DTensor) else None,
            "untouched": all(not isinstance(p, DTensor) for p in whole.parameters()),
        }
    # The meter counts what autograd saves as DTensors by their local storage: a column-parallel
    # linear saves its input (a replicated DTensor over the plain input's storage), 5 x 8 floats.
    linear = parallelize_module(torch.nn.Linear(8, 16), mesh["tp"], ColwiseParallel(), src_data_rank=None)
    meter = SavedTensorMeter([*linear.parameters()])
    with meter.hooks():
        kept = linear(torch.randn(5, 8, requires_grad=True))
    results["linear_saved_bytes"] = meter.bytes
    del kept
    results["reference_loss"] = want.loss
    results["executor"] = _executor_runs(Layout(1, 1, TP), [("1f1b", 2, None), ("zb-h1", 2, None), ("interleaved", 2, 2)])
    results["full_qkv_rows"] = model.layers[0].attn.qkv.weight[:, 0].tolist()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def _pipeline_worker(rank: int, port: int, out: str) -> None:
    """4 ranks: every registered schedule at pp=2 x tp=2, and two at dp=2 x tp=2, with --check."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    import schedules
    from runtime.layout import Layout

    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=60))
    runs = _executor_runs(Layout(2, 1, TP), [(name, 4, None) for name in schedules.available()])
    runs += _executor_runs(Layout(1, 2, TP), [("1f1b", 2, None), ("zb-h1", 2, None)])
    sgd = _replicas_after_sgd(Layout(1, 2, TP))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"runs": runs, "sgd": sgd}, f)
    dist.destroy_process_group()


def _replicas_after_sgd(layout) -> dict:
    """Two zb-h1 steps with SGD after each on tp-sharded parameters: every parameter (gathered
    whole over tp) against one process doing the same on the full batch, and each rank's
    shard against the same shard of the other dp replicas, bit for bit."""
    import hashlib

    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import schedules
    from runtime import RunOptions

    program = schedules.lower(schedules.build("zb-h1", ranks=layout.pp, microbatches=2), layout.dp)
    model = build_model(ModelSpec(**dict(GPT, layers=program.schedule.num_stages, batch_size=2 * layout.dp)))
    error, params = sgd_against_one_process(program, model, RunOptions(timeout=60, layout=layout))
    sharded = sum(isinstance(p, DTensor) for _, p in params)
    digest = hashlib.sha256()
    for _, p in params:
        digest.update((p.to_local() if isinstance(p, DTensor) else p).detach().numpy().tobytes())
    digests = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest.hexdigest())
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    rank = dist.get_rank()
    return {"max_relative_error": max(errors), "sharded": sharded,
            "replica_digests": [digests[r] for r in layout.dp_group(rank)],
            "tp_digests": [digests[r] for r in layout.tp_group(rank)]}


def _spawn(target, world: int, out: str) -> list:
    codes = spawn_ranks(target, world, (free_port(), out), timeout=180)
    assert codes == [0] * world, f"ranks exited with {codes}"
    results = []
    for r in range(world):
        with open(f"{out}.{r}") as f:
            results.append(json.load(f))
    return results


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    return _spawn(_worker, TP, str(tmp_path_factory.mktemp("tp") / "result"))


def _cube_worker(rank: int, port: int, out: str) -> None:
    """(pp, dp, tp) = (2, 2, 2) on 8 ranks: one small case with --check."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from runtime.layout import Layout

    dist.init_process_group("gloo", rank=rank, world_size=8, timeout=datetime.timedelta(seconds=60))
    runs = _executor_runs(Layout(2, 2, TP), [("1f1b", 2, None)])
    with open(f"{out}.{rank}", "w") as f:
        json.dump(runs, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def pp_tp_run(tmp_path_factory):
    return _spawn(_pipeline_worker, 4, str(tmp_path_factory.mktemp("pp_tp") / "result"))


@pytest.mark.parametrize("split", ["False", "True"], ids=["backward", "split-I-W"])
def test_tp2_loss_and_every_gradient_equal_one_process(tp_run, split):
    for rank, result in enumerate(tp_run):
        run = result[split]
        assert abs(run["loss"] - result["reference_loss"]) <= 1e-5 * abs(result["reference_loss"])
        worst = max(run["errors"], key=run["errors"].get)
        assert run["errors"][worst] <= 1e-4, f"rank {rank}: {worst} off by {run['errors'][worst]:.2e}"
        assert run["untouched"]  # the PipelineModel's own blocks stay whole


def test_tp2_shards_whole_heads_and_hands_plain_full_activations_to_the_pipeline(tp_run):
    hidden, rows_per_rank = GPT["hidden"], 3 * GPT["hidden"] // TP
    for rank, result in enumerate(tp_run):
        run = result["False"]
        assert run["boundary_type"] == "Tensor"  # a plain tensor, not a DTensor
        assert run["boundary_shape"] == [GPT["batch_size"], GPT["seq_len"], hidden]
        assert run["qkv_local_shape"] == [rows_per_rank, hidden]
        # rank r holds the contiguous rows of heads [r h/t, (r+1) h/t): q, k, v of each
        want = result["full_qkv_rows"][rank * rows_per_rank:(rank + 1) * rows_per_rank]
        assert run["qkv_local_rows"] == pytest.approx(want)


def test_the_memory_meter_counts_tensors_saved_as_dtensors(tp_run):
    assert [r["linear_saved_bytes"] for r in tp_run] == [5 * 8 * 4] * TP


def _assert_checked(runs: list[dict], layout: dict) -> None:
    for run in runs:
        check = run["check"]
        assert run["passed"], f"{run['schedule']}: --check failed: {check}"
        assert check["parameters_missing"] == [] and check["max_relative_error"] <= 1e-4
        assert check["replicas_identical"]
        assert {k: run["layout"][k] for k in layout} == layout
        assert run["rows"] == run["expected_rows"]  # one pipeline's rows (dp = tp = 0), once


def test_executor_at_tp2_passes_check(tp_run):
    runs = tp_run[0]["executor"]
    assert [r["schedule"] for r in runs] == ["1f1b", "zb-h1", "interleaved"]
    assert all(r["executor"] == [] for r in tp_run[1:])  # only global rank 0 gathers
    _assert_checked(runs, {"pp": 1, "dp": 1, "tp": TP})
    # One rank's share of a stage: sharded linears hold half their weights (and column-parallel
    # biases), row-parallel biases, LayerNorms, embedding and head stay whole.
    h, v, s = GPT["hidden"], GPT["vocab"], GPT["seq_len"]
    block = 2 * 2 * h + (3 * h * h + 3 * h) // TP + h * h // TP + h + (4 * h * h + 4 * h) // TP + 4 * h * h // TP + h
    embedding, head = v * h + s * h, 2 * h + h * v + v
    assert runs[0]["params"] == [embedding + block + head]


def test_executor_at_pp2_tp2_passes_check_for_every_schedule(pp_tp_run):
    import schedules

    runs = pp_tp_run[0]["runs"][:len(schedules.available())]
    assert [r["schedule"] for r in runs] == list(schedules.available())
    _assert_checked(runs, {"pp": 2, "dp": 1, "tp": TP})


def test_executor_at_dp2_tp2_passes_check_with_identical_replicas(pp_tp_run):
    import schedules

    runs = pp_tp_run[0]["runs"][len(schedules.available()):]
    assert [r["schedule"] for r in runs] == ["1f1b", "zb-h1"]
    _assert_checked(runs, {"pp": 1, "dp": 2, "tp": TP})


def test_dp2_tp2_replicas_stay_identical_through_sgd_steps(pp_tp_run):
    for result in pp_tp_run:
        sgd = result["sgd"]
        # One stage of one block: its 4 linears' weights and biases are DTensors (the row-parallel
        # biases replicated ones); LayerNorms, embedding and head stay plain.
        assert sgd["sharded"] == 8
        assert sgd["max_relative_error"] <= 1e-4
        assert len(set(sgd["replica_digests"])) == 1  # the same shard on both replicas, bit for bit
        assert len(set(sgd["tp_digests"])) == TP  # and different shards within the tp group


# ------------------------------------------------------------------ command line

GPT_ARGS = ["--model", "gpt", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "8", "--vocab", "32",
            "--batch-size", "4"]


@pytest.mark.parametrize(
    "world, args, message",
    [
        (3, ["--tp", "3", *GPT_ARGS], "--tp 3 does not divide --heads 4: each tensor-parallel rank needs whole attention heads"),
        (2, ["--tp", "2", "--model", "mlp", "--layers", "2", "--hidden", "8", "--batch-size", "4"],
         "--tp 2: the mlp model runs with --tp 1 only"),
    ],
    ids=["heads", "mlp"],
)
def test_cli_refuses_bad_tp_on_every_rank_before_communicating(tmp_path, world, args, message):
    # Ranks without torchrun or partners: any communication would hang until the test's timeout.
    procs = []
    for rank in range(world):
        env = {**rank_env(), "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "runtime", "--schedule", "1f1b", "--microbatches", "2", *args, "--out", str(tmp_path / "run")],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for rank, proc in enumerate(procs):
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 2, stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"rank {rank}: error: ") and message in lines[0], stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc")
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_dead_or_stopped_tp_peer_ends_the_run_with_one_line(tmp_path, how):
    timeout = 3
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "runtime", "--tp", "2", "--schedule", "1f1b", "--microbatches", "2", *GPT_ARGS,
           "--steps", "100000", "--warmup", "0", "--timeout", str(timeout), "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(proc)
        waited = fail_rank_one(proc, how, timeout)
        if how == "stopped":
            assert waited < timeout + 30  # the tp group's collectives time out at --timeout, not torch's 30 min
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    # Rank 0 waits in a tp collective of F or B, or (rarely) at a step's barrier.
    assert_peer_failure_named(
        stderr, r"error: rank 0: (0[FB]\d+ failed in a collective of its tensor-parallel group \(ranks 0, 1\)|"
        r"barrier (before|after) (a warm-up|measured) step( \d+)? failed): .*", how, timeout)
    assert f"{os.sep}runtime{os.sep}" not in stderr, stderr


def test_executor_at_pp2_dp2_tp2_passes_check(tmp_path):
    runs = _spawn(_cube_worker, 8, str(tmp_path / "result"))[0]
    assert [r["schedule"] for r in runs] == ["1f1b"]
    _assert_checked(runs, {"pp": 2, "dp": 2, "tp": TP})
