"""Tensor parallelism inside a stage (runtime/tensor_parallel.py): the gpt blocks split across a
2-rank gloo "tp" mesh must give the loss and every gradient of one process running the whole
model, alone and inside the executor at (pp, dp, tp) = (1, 1, 2) and (2, 1, 2) for every
registered schedule; bad splits are refused before any communication; a dead or stopped tp
peer ends the run with one line."""

import datetime
import json
import math
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from runtime import ConfigError, ModelSpec, build_model
from runtime.models import CausalSelfAttention
from runtime.tensor_parallel import check_tensor_parallel

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
        program = schedules.lower(schedules.build(name, ranks=layout.pp, microbatches=m, chunks=chunks))
        spec = ModelSpec(**dict(GPT, layers=program.schedule.num_stages, batch_size=2 * m + 1))
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
    """pp=2 x tp=2 on 4 ranks: every registered schedule through the executor with --check."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    import schedules
    from runtime.layout import Layout

    dist.init_process_group("gloo", rank=rank, world_size=4, timeout=datetime.timedelta(seconds=60))
    runs = _executor_runs(Layout(2, 1, TP), [(name, 4, None) for name in schedules.available()])
    with open(f"{out}.{rank}", "w") as f:
        json.dump(runs, f)
    dist.destroy_process_group()


def _spawn(target, world: int, out: str) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, port, out)) for r in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=180)
    codes = [proc.exitcode for proc in procs]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    assert codes == [0] * world, f"ranks exited with {codes}"
    results = []
    for r in range(world):
        with open(f"{out}.{r}") as f:
            results.append(json.load(f))
    return results


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    return _spawn(_worker, TP, str(tmp_path_factory.mktemp("tp") / "result"))


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
        assert run["layout"]["tp"] == layout["tp"] and run["layout"]["pp"] == layout["pp"]
        assert run["rows"] == run["expected_rows"]  # one pipeline's rows (dp = tp = 0), once


def test_executor_at_tp2_passes_check(tp_run):
    runs = tp_run[0]["executor"]
    assert [r["schedule"] for r in runs] == ["1f1b", "zb-h1", "interleaved"]
    assert all(r["executor"] == [] for r in tp_run[1:])  # only global rank 0 gathers
    _assert_checked(runs, {"pp": 1, "tp": TP})
    # One rank's share of a stage: sharded linears hold half their weights (and column-parallel
    # biases), row-parallel biases, LayerNorms, embedding and head stay whole.
    h, v, s = GPT["hidden"], GPT["vocab"], GPT["seq_len"]
    block = 2 * 2 * h + (3 * h * h + 3 * h) // TP + h * h // TP + h + (4 * h * h + 4 * h) // TP + 4 * h * h // TP + h
    embedding, head = v * h + s * h, 2 * h + h * v + v
    assert runs[0]["params"] == [embedding + block + head]


def test_executor_at_pp2_tp2_passes_check_for_every_schedule(pp_tp_run):
    import schedules

    runs = pp_tp_run[0]
    assert [r["schedule"] for r in runs] == list(schedules.available())
    _assert_checked(runs, {"pp": 2, "tp": TP})
