"""Rank 0's records and the --check verdict, in this process (runtime/record.py, runtime/reference.py).

One rank (a world of 1, gloo) runs a 2-stage interleaved program of a tiny mlp: the whole
gather path runs here, where mutation testing (bench/mutation.sh) sees it, and its summary
is checked against the run's own tables and an independent full-batch computation. The
verdict's rules (tolerance inclusive, a missing gradient or loss fails) are checked on
hand-made payloads.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import stat

import pytest
import torch
import torch.distributed as dist

import schedules
from schedules import ScheduleError
from runtime import ModelSpec, RunOptions, build_model, execute, write_outputs
from runtime.record import _verdict, clear_summary, format_summary
from runtime.reference import TOLERANCE, relative_error
from schedules.timeline import COMPUTE_NAMES, CPU_COLUMNS, read_table
from sim.measured import read_measured

SPEC = ModelSpec(model="mlp", layers=2, hidden=8, batch_size=4)


@pytest.fixture(scope="module")
def run():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    try:
        program = schedules.lower(schedules.build("interleaved", ranks=1, microbatches=2, chunks=2))
        model = build_model(SPEC)
        result = execute(program, model, RunOptions(steps=2, check=True, timeout=60))
    finally:
        dist.destroy_process_group()
    return program, model, result


def test_summary_agrees_with_its_tables_and_a_full_batch_run(run):
    program, model, result = run
    summary = result.summary
    assert result.passed is True and summary["check"]["passed"] is True
    assert (summary["schedule"], summary["ranks"], summary["microbatches"], summary["chunks"], summary["stages"]) == (
        "interleaved", 1, 2, 2, 2)
    assert summary["placement"] == "looped" and summary["microbatch_sizes"] == [2, 2]
    assert summary["steps"] == 2 and len(summary["step_times"]) == 2 and summary["warmup"] == 0
    assert summary["batch_bytes"] == model.inputs.nbytes + model.targets.nbytes
    # The loss of one process on the full batch, from the module itself.
    full = model.full_module()
    with torch.no_grad():
        loss = float(model.loss(full(model.inputs), model.targets))
    assert summary["loss"] == pytest.approx(loss, rel=1e-6)
    timeline = result.timeline
    assert len(timeline) == 2 * program.num_actions and set(timeline["step"]) == {0, 1}
    ratios, spans = [], []
    for _, rows in timeline.groupby("step"):
        compute = rows[rows["kind"].isin(COMPUTE_NAMES)]
        busy = (compute["end"] - compute["start"]).sum()
        ratios.append(1 - busy / rows["end"].max())
        span = compute["end"].max() - compute["start"].min()
        spans.append((span - busy) / span)
    assert summary["bubble_ratio"] == pytest.approx(sum(ratios) / 2, rel=1e-9)
    assert summary["bubble_ratio_rank_span"] == pytest.approx(sum(spans) / 2, rel=1e-9)
    assert summary["makespan_median"] == pytest.approx(timeline.groupby("step")["end"].max().mean(), rel=1e-12)
    assert summary["peak_activation_bytes"] == [int(result.memory["bytes"].max())]
    costs = summary["stage_costs"]
    assert [(c["stage"], c["rank"], c["chunk"], c["layers"]) for c in costs] == [(0, 0, 0, [0, 1]), (1, 0, 1, [1, 2])]
    hidden = SPEC.hidden
    assert [c["params"] for c in costs] == [hidden * hidden + hidden] * 2
    assert [c["param_bytes"] for c in costs] == [4 * (hidden * hidden + hidden)] * 2
    assert costs[0]["output_bytes_per_microbatch"] == 2 * hidden * 4 and costs[1]["output_bytes_per_microbatch"] is None
    assert all(c["F_seconds"] > 0 and c["B_seconds"] > 0 for c in costs)
    # What the run directory promises (README "Running a schedule"), with this run's values.
    assert sorted(summary) == sorted([
        "backend", "batch_bytes", "batch_size", "bubble_ratio", "bubble_ratio_rank_span", "check", "chunks",
        "clock_alignment", "clocks", "cpu_cores", "device", "freed_memory", "layout", "loss", "makespan_median", "microbatch_sizes", "microbatches",
        "local_world_size", "model", "parameter_bytes", "peak_activation_bytes", "peak_cuda_allocated_bytes", "placement",
        "post_ahead", "process_cpu_seconds", "python", "rank_step_starts", "ranks", "schedule", "stage_costs", "stages", "step_time_median",
        "step_times",
        "steps", "timeout_seconds", "torch_threads", "torch_version", "transport", "warmup"])
    assert summary["layout"] == {"pp": 1, "dp": 1, "tp": 1, "mesh_dims": ["pp", "dp", "tp"], "world_size": 1}
    layer_bytes = 4 * (hidden * hidden + hidden)  # one Linear(hidden, hidden) in fp32
    assert summary["parameter_bytes"] == {"prologue": 0, "layers": [layer_bytes, layer_bytes], "epilogue": 0}
    assert (summary["backend"], summary["transport"], summary["post_ahead"], summary["device"]) == (
        "gloo", "tagged", "step", "cpu")
    assert summary["torch_version"] == torch.__version__ and summary["torch_threads"] == torch.get_num_threads()
    assert summary["timeout_seconds"] == 60 and summary["peak_cuda_allocated_bytes"] is None
    # RunOptions' default on CPU (runtime.allocator), where glibc lets it be set
    assert summary["freed_memory"] == ("keep" if platform.libc_ver()[0] == "glibc" else
                                       "unchanged: the C library is not glibc")
    assert summary["cpu_cores"] == len(os.sched_getaffinity(0)) and summary["local_world_size"] == 1
    assert summary["model"] == dict(model.flags) and summary["batch_size"] == SPEC.batch_size
    assert summary["step_time_median"] == pytest.approx(sum(summary["step_times"]) / 2, rel=1e-12)
    assert set(timeline["source"]) == set(result.memory["source"]) == {"measured"} and result.cuda_memory is None
    assert sorted(timeline["rank"].unique()) == [0]
    check = summary["check"]
    assert check["parameters_checked"] == 4 and check["parameters_missing"] == []
    assert check["tolerance"] == TOLERANCE == 1e-4 and check["max_relative_error"] < 1e-5


def test_each_compute_action_records_its_own_cpu_time(run):
    """cpu.csv's rows are the timeline's compute rows, one each, and a thread cannot use more
    CPU than the wall time its row spans (both clocks read around the action, the CPU clock
    inside: 50 us of slack for their order and the CPU clock's tick) nor none at all; the
    process's CPU over a step's stream holds its actions' and is no more than its threads
    could use in the step's wall time on every core."""
    _, _, result = run
    timeline = result.timeline
    compute = timeline[timeline["kind"].isin(COMPUTE_NAMES)]
    cpu = result.cpu
    assert list(cpu.columns) == list(CPU_COLUMNS)
    rows = compute.merge(cpu, on=["step", "rank", "action"], how="outer", validate="one_to_one", indicator=True)
    assert (rows["_merge"] == "both").all() and len(rows) == len(compute)
    wall = rows["end"] - rows["start"]
    assert (rows["thread_cpu"] > 0).all() and (rows["thread_cpu"] <= wall + 50e-6).all()
    process = result.summary["process_cpu_seconds"]
    assert len(process) == 1 and len(process[0]) == 2
    for step, seconds in enumerate(process[0]):
        assert seconds >= cpu.loc[cpu["step"] == step, "thread_cpu"].sum() - 50e-6
        assert seconds <= result.summary["step_times"][step] * os.cpu_count() + 0.01


def test_outputs_are_written_readable_and_summary_last(run, tmp_path):
    program, _, result = run
    out = tmp_path / "runs" / "run"  # parents are made
    write_outputs(result, program, out)
    write_outputs(result, program, out)  # and an existing directory is reused
    assert sorted(p.name for p in out.iterdir()) == ["cpu.csv", "memory.csv", "program.json", "summary.json", "timeline.csv"]
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(result.summary))
    assert stat.S_IMODE((out / "summary.json").stat().st_mode) == 0o644
    assert len(read_table(out / "timeline.csv", "timeline")) == len(result.timeline)
    assert read_measured(out).cpu.equals(result.cpu)
    assert schedules.load_program_json(out / "program.json") == program
    clear_summary(out)
    assert not (out / "summary.json").exists() and (out / "timeline.csv").exists()
    clear_summary(out)  # nothing to remove: no error


@pytest.mark.parametrize("text, message", [
    ("step,rank,action\n0,0,0F0\n", "lacks the columns thread_cpu"),
    ("step,rank,action,thread_cpu\n0,0,0F0,-1e-3\n", "thread_cpu must be non-negative seconds"),
    ("step,rank,action,thread_cpu\n0,0,0F0,soon\n", "thread_cpu must be non-negative seconds"),
    ("", "cannot be read"),
])
def test_a_malformed_cpu_table_is_one_clear_error(run, tmp_path, text, message):
    program, _, result = run
    write_outputs(result, program, tmp_path)
    (tmp_path / "cpu.csv").write_text(text)
    with pytest.raises(ScheduleError, match=message) as error:
        read_measured(tmp_path).cpu
    assert "\n" not in str(error.value)
    (tmp_path / "cpu.csv").unlink()
    assert read_measured(tmp_path).cpu is None  # a run from before the table


def test_printed_summary(run):
    _, _, result = run
    s = result.summary
    text = format_summary(s).splitlines()
    assert text[0] == f"interleaved: p=1 m=2 v=2 (looped placement), model {s['model']}"
    assert text[2] == f"step time median {s['step_time_median'] * 1e3:.2f} ms over 2 steps (after 0 warm-up)"
    assert text[3] == f"bubble ratio {s['bubble_ratio']:.3f} (rank-span {s['bubble_ratio_rank_span']:.3f})"
    assert text[5] == f"loss {s['loss']:.6g}"
    assert text[6].startswith("  stage 0 (rank 0, layers 0..0): F ") and " B " in text[6]
    assert text[-1].startswith("check PASSED: largest relative gradient error ") and text[-1].endswith(
        "tolerance 0.0001")
    failed = {**s, "check": {**s["check"], "passed": False, "parameters_missing": ["b", "c"]}}
    assert format_summary(failed).splitlines()[-1].startswith("check FAILED")
    assert format_summary(failed).endswith("; no gradient for b, c")
    diverged = {**s, "check": {**s["check"], "passed": False, "replicas_identical": False}}
    assert format_summary(diverged).endswith("; data-parallel replicas hold different gradients")
    assert text[4] == "peak activation bytes per rank: " + ", ".join(f"{b:,}" for b in s["peak_activation_bytes"])


def _payload(errors, loss, names=None, coords=(0, 0, 0), digest="d", reference_loss=2.0):
    """One rank's check payload: its gradients' errors, its last stage's loss (or None)."""
    return {"coords": coords, "loss": loss,
            "check": {"errors": errors, "reference_loss": reference_loss, "names": sorted(names or errors),
                      "grad_digest": digest}}


def test_verdict_rules():
    # Two pipeline stages: their gradients differ (digests), as they should.
    exact = _verdict([_payload({"a": 0.0}, None, names=["a", "b"], digest="d0"),
                      _payload({"b": 0.0}, 2.0, coords=(1, 0, 0), digest="d1")], 1e-4)
    assert exact["passed"] is True and exact["parameters_checked"] == 2 and exact["loss_relative_error"] == 0.0
    at_tolerance = _verdict([_payload({"a": 1e-4, "b": 5e-5}, 2.0 * (1 + 1e-4))], 1e-4)
    assert at_tolerance["passed"] is True and at_tolerance["worst_parameter"] == "a"
    assert at_tolerance["max_relative_error"] == 1e-4
    assert at_tolerance["loss_relative_error"] == pytest.approx(1e-4, rel=1e-9)
    assert _verdict([_payload({"a": 1.01e-4}, 2.0)], 1e-4)["passed"] is False
    assert _verdict([_payload({"a": 0.0}, 2.0 * (1 + 1.01e-4))], 1e-4)["passed"] is False  # the loss alone
    missing = _verdict([_payload({"a": 0.0}, 2.0, names=["a", "b"])], 1e-4)
    assert missing["passed"] is False and missing["parameters_missing"] == ["b"]
    assert _verdict([_payload({"a": 0.0}, None)], 1e-4)["passed"] is False  # no rank saw the loss
    # Two data-parallel replicas of one stage: the worse error counts, their losses are averaged,
    # and their gradients must be bit-identical.
    replicas = [_payload({"a": 3e-6}, 1.9, coords=(0, 0, 0)), _payload({"a": 1e-6}, 2.1, coords=(0, 1, 0))]
    both = _verdict(replicas, 1e-4)
    assert both["passed"] is True and both["max_relative_error"] == 3e-6 and both["loss_relative_error"] < 1e-12
    # The loss error is relative to the reference's, also below 1.
    small = _verdict([_payload({"a": 0.0}, 0.5 * (1 + 2e-4), reference_loss=0.5)], 1e-4)
    assert small["passed"] is False and small["loss_relative_error"] == pytest.approx(2e-4, rel=1e-9)
    nothing = _verdict([_payload({}, 2.0)], 1e-4)  # a model without parameters
    assert nothing["passed"] is True and nothing["worst_parameter"] is None and nothing["max_relative_error"] == 0.0
    replicas[1]["check"]["grad_digest"] = "other"
    diverged = _verdict(replicas, 1e-4)
    assert diverged["passed"] is False and diverged["replicas_identical"] is False


def test_relative_error_is_scaled_by_the_reference():
    want = torch.tensor([2.0, -4.0])
    assert relative_error(torch.tensor([2.0, -3.0]), want) == pytest.approx(0.25)
    assert relative_error(None, want) == 1.0  # a missing gradient counts as zeros
    assert relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_error(torch.ones(2), torch.zeros(2)) == float("inf")


def test_reference_gives_an_unused_parameter_a_zero_gradient():
    """A parameter the loss never reaches has no .grad after backward: the reference must
    still name it, with zeros (what the pipeline's stage leaves it), not fail."""
    from torch import nn

    from runtime import from_layers
    from runtime.reference import compute

    class WithSpare(nn.Linear):
        def __init__(self):
            super().__init__(3, 3)
            self.spare = nn.Parameter(torch.ones(2))

    torch.manual_seed(0)
    model = from_layers(nn.Sequential(WithSpare(), nn.Linear(3, 3)), nn.functional.mse_loss,
                        torch.randn(4, 3), torch.randn(4, 3))
    ref = compute(model, torch.device("cpu"))
    spare = [name for name in ref.grads if name.endswith("spare")]
    assert len(spare) == 1 and torch.equal(ref.grads[spare[0]], torch.zeros(2))
    assert all(g.abs().sum() > 0 for name, g in ref.grads.items() if name not in spare)
