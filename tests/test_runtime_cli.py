"""The command line: real `torchrun` launches (one node and two), configuration errors on
every rank before any communication, and a dead or stopped peer ending the run."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import schedules
from schedules.timeline import COMPUTE_NAMES, read_table
from sim.measured import read_measured
from ranks import assert_peer_failure_named, fail_rank_one, free_port, rank_env, wait_ready

VENV_BIN = Path(sys.executable).parent
TORCHRUN = str(VENV_BIN / "torchrun")
REPO = Path(__file__).resolve().parents[1]
TINY = ["--layers", "4", "--hidden", "16", "--batch-size", "8"]
TINY_GPT = ["--model", "gpt", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "4", "--vocab", "32",
            "--batch-size", "6"]


def _torchrun(args, tmp_path, nproc=2, extra=()):
    cmd = [TORCHRUN, "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           *extra, "-m", "runtime", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=rank_env(), capture_output=True, text=True, timeout=180)


def _our_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.match(r"(rank \d+: )?error: ", line)]


def _no_traceback_from_us(stderr: str) -> None:
    assert f"{os.sep}runtime{os.sep}" not in stderr, stderr  # torchrun's own report may hold a traceback


def test_torchrun_check_writes_the_outputs(tmp_path):
    out = tmp_path / "run"
    args = ["--schedule", "zb-h1", "--microbatches", "4", *TINY_GPT, "--steps", "2", "--warmup", "1", "--check",
            "--timeout", "60", "--out", str(out)]
    proc = _torchrun(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "check PASSED" in proc.stdout and "largest relative gradient error" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["cpu.csv", "memory.csv", "program.json", "summary.json",
                                                      "timeline.csv"]
    program = schedules.load_program_json(out / "program.json")
    assert program == schedules.lower(schedules.build("zb-h1", ranks=2, microbatches=4))
    timeline = read_table(out / "timeline.csv", "timeline")
    assert len(timeline) == 2 * program.num_actions and sorted(timeline["step"].unique()) == [0, 1]
    assert set(timeline["source"]) == {"measured"}
    assert {"I", "W"} <= set(timeline["kind"])
    memory = read_table(out / "memory.csv", "memory")
    assert set(memory["rank"]) == {0, 1}
    cpu = read_measured(out).cpu  # both ranks' compute actions, every recorded step, from the launched run
    compute = timeline[timeline["kind"].isin(COMPUTE_NAMES)]
    assert len(cpu) == len(compute) and set(cpu["rank"]) == {0, 1} and (cpu["thread_cpu"] >= 0).all()
    summary = json.loads((out / "summary.json").read_text())
    for key in ("schedule", "ranks", "microbatches", "chunks", "model", "step_time_median", "bubble_ratio",
                "peak_activation_bytes", "backend", "device", "torch_version", "stage_costs", "batch_size",
                "steps", "warmup"):
        assert key in summary, key
    assert summary["schedule"] == "zb-h1" and summary["ranks"] == 2 and summary["backend"] == "gloo"
    assert summary["model"]["model"] == "gpt" and summary["steps"] == 2 and summary["warmup"] == 1
    assert len(summary["step_times"]) == 2 and summary["step_time_median"] > 0
    assert 0 <= summary["bubble_ratio"] < 1 and len(summary["peak_activation_bytes"]) == 2
    # A sub-second step still has its bubble: 1 - busy / (p x makespan) from the run's own rows.
    ratios = []
    for _, rows in timeline.groupby("step"):
        compute = rows[rows["kind"].isin(["F", "B", "I", "W"])]
        ratios.append(1 - (compute["end"] - compute["start"]).sum() / (2 * rows["end"].max()))
    assert timeline["end"].max() < 1.0 and min(ratios) > 0
    assert summary["bubble_ratio"] == pytest.approx(sum(ratios) / 2, rel=1e-9)  # median of two steps
    assert summary["check"]["passed"] is True
    costs = summary["stage_costs"]
    assert [c["stage"] for c in costs] == [0, 1]
    assert costs[0]["output_bytes_per_microbatch"] == 2 * 4 * 16 * 4  # 2 rows x seq 4 x hidden 16 x fp32
    assert {"F_seconds", "I_seconds", "W_seconds", "activation_bytes", "weight_grad_bytes"} <= set(costs[0])


def _launch(args, *, nproc=2, extra=(), cwd=None):
    cmd = [TORCHRUN, "--nproc-per-node", str(nproc), *extra, "-m", "runtime", *args]
    return subprocess.Popen(cmd, cwd=cwd, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers through /proc")
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_dead_or_silent_peer_ends_the_run_with_an_error_naming_rank_and_wait(tmp_path, how):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # a stale summary must not survive a failed run
    timeout = 3
    args = ["--schedule", "1f1b", "--microbatches", "4", "--layers", "4", "--hidden", "256", "--batch-size", "64",
            "--steps", "100000", "--warmup", "0", "--timeout", str(timeout), "--out", str(out)]
    proc = _launch(args, extra=["--master-addr", "127.0.0.1", "--master-port", str(free_port())], cwd=tmp_path)
    try:
        wait_ready(proc)
        waited = fail_rank_one(proc, how, timeout)
        if how == "stopped":
            assert waited < timeout + 30  # rank 0 gave up on its own after the timeout
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Documented (runtime/cli.py): 1 when a peer failed. torchrun exits 1 for any failed worker,
    # so read rank 0's own exit code from torchrun's failure report.
    assert proc.returncode == 1
    codes = re.findall(r"rank\s+: 0 \(local_rank: 0\)\s+exitcode\s+: (-?\d+)", stderr)
    assert codes == ["1"], stderr[-3000:]
    assert_peer_failure_named(
        stderr, r"error: rank 0: (gave up on \d+(RECV|SEND)_[FB]\d+ \(peer rank 1\)|barrier (before|after) "
        r"(a warm-up|measured) step( \d+)? failed): .*", how, timeout)
    _no_traceback_from_us(stderr)
    assert not (out / "summary.json").exists()


def _fake_rank(rank: int, world: int, args, cwd):
    """`python -m runtime` as rank `rank` of `world` without torchrun: any communication would hang."""
    env = {**rank_env(), "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    return subprocess.Popen([sys.executable, "-m", "runtime", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--schedule", "1f1b", "--microbatches", "2", "--layers", "1"],
         "the model has 1 layers, fewer than the schedule's 2 stages"),
        (["--schedule", "interleaved", "--microbatches", "3", *TINY],
         "interleaved with p=2 and group size 2 cannot run m=3 microbatches"),
        (["--program", "{program}", *TINY], "needs 4 ranks but the world has 2"),
        (["--schedule", "gpipe", "--microbatches", "16", *TINY], "--batch-size 8 is smaller than --microbatches 16"),
        (["--schedule", "gpipe", "--microbatches", "2", "--model", "gpt", "--hidden", "30", "--heads", "4"],
         "--hidden 30 is not divisible by --heads 4"),
    ],
    ids=["layers", "microbatches", "world-size", "batch", "heads"],
)
def test_configuration_errors_fail_every_rank_before_communicating(tmp_path, args, message):
    program = tmp_path / "p4.json"
    schedules.save_json(schedules.lower(schedules.build("1f1b", ranks=4, microbatches=4)), program)
    args = [a.replace("{program}", str(program)) for a in args] + ["--out", str(tmp_path / "run")]
    procs = [_fake_rank(rank, 2, args, tmp_path) for rank in range(2)]
    for rank, proc in enumerate(procs):
        stdout, stderr = proc.communicate(timeout=60)  # no partner process exists: talking would hang
        assert proc.returncode == 2, stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"rank {rank}: error: ") and message in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_bad_argument_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "runtime", "--schedule", "1f1b", "--microbatches", "two"],
                          cwd=tmp_path, env=rank_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid int value: 'two'" in proc.stderr


def test_a_bad_freed_memory_setting_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "runtime", "--schedule", "1f1b", "--microbatches", "2",
                           "--freed-memory", "hoard"], cwd=tmp_path, env=rank_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(
        "argument --freed-memory: expected 'keep' or 'release'; got 'hoard'"), proc.stderr


def test_two_nodes_with_c10d_rendezvous_pass_check(tmp_path):
    """Two torchrun agents, one rank each, meeting through a c10d rendezvous on 127.0.0.1."""
    port = free_port()
    out = tmp_path / "run"
    agents = [
        _launch(
            ["--schedule", "1f1b", "--microbatches", "3", *TINY_GPT, "--steps", "1", "--warmup", "0", "--check",
             "--timeout", "60", "--out", str(out)],
            nproc=1,
            extra=["--nnodes", "2", "--node-rank", str(node), "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"bubblescope-{port}"],
            cwd=tmp_path,
        )
        for node in (0, 1)
    ]
    results = [agent.communicate(timeout=180) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], [r[1][-2000:] for r in results]
    assert sum("check PASSED" in stdout for stdout, _ in results) == 1  # printed by global rank 0 only
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["check"]["passed"] is True


def test_a_rank_stopped_by_the_launcher_says_so_after_its_grace():
    """torchrun SIGTERMs the surviving ranks within 0.1 s of a failure; a rank that has not found
    the failure itself by the end of its grace must still leave one line, and exit 1."""
    code = ("import sys, time; from runtime.cli import report_termination; report_termination(3, grace=0.3); "
            "print('ready', flush=True); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=rank_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
        waited = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert 0.3 <= waited < 10
    assert _our_lines(stderr) == [
        "error: rank 3: stopped by the launcher (SIGTERM) before finding a failure itself; "
        "another rank's line names the cause"
    ], stderr
