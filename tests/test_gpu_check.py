"""bench/gpu_check.sh on the CPU (its gloo fallback, end to end) and its report's parsing and format.

The end-to-end runs use the script's small CPU sizes (mlp: 4 layers, hidden 64, 4 rows per
microbatch; gpt for the checks); weights and batch bytes are checked in closed form.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def load_report():
    return load_script(ROOT / "bench" / "gpu_check_report.py")


R = load_report()

# The CPU fallback's timing model: mlp, 4 layers of Linear(64, 64) + ReLU, 4 rows per microbatch, fp32.
LAYER_BYTES = (64 * 64 + 64) * 4
ROWS, HIDDEN = 4, 64


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(shutil.which("timeout") is None or shutil.which("bash") is None, reason="needs bash and timeout")
@pytest.mark.parametrize("world", [1, 2])
def test_script_runs_end_to_end_on_the_cpu(tmp_path, world):
    out = tmp_path / "check"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WORLD": str(world)}
    done = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (out / "report.txt").read_text()
    assert report.strip() in done.stdout
    assert report.startswith("GPU check: no GPU (")  # CPU fallback named as such

    steps = R.read_steps(out / "steps.tsv")
    names = [s.name for s in steps]
    checks = ["p1-interleaved", "p1-zbv-program"] + (
        ["check-gpipe", "check-1f1b", "check-interleaved", "check-zb-h1"] if world >= 2 else [])
    heldout = ["heldout-gpipe", "heldout-1f1b"] if world >= 2 else ["heldout-looped-bfs", "heldout-interleaved"]
    assert [s.name for s in steps if s.role == "check"] == checks
    assert [s.name for s in steps if s.role == "heldout"] == heldout
    assert "calib-interleaved" in names and "sim-calibrate" in names
    assert all(s.code == 0 for s in steps)

    table = rows(out / "checks.csv")
    assert [r["name"] for r in table] == checks
    for r in table:
        summary = json.loads((out / "runs" / r["name"] / "summary.json").read_text())
        assert r["verdict"] == "PASSED" and summary["check"]["passed"]
        assert float(r["max_relative_error"]) == summary["check"]["max_relative_error"] <= 1e-4
        assert summary["backend"] == "gloo"
    assert {(r["schedule"], r["ranks"]) for r in table} >= {("interleaved", "1"), ("zbv", "1")}

    predictions = rows(out / "predictions.csv")
    assert [p["name"] for p in predictions] == heldout
    for p in predictions:
        comparison = json.loads((out / f"compare-{p['name']}.json").read_text())
        assert float(p["step_time_measured"]) == comparison["step_time_measured"] > 0
        assert float(p["step_time_error"]) == pytest.approx(
            comparison["step_time_simulated"] / comparison["step_time_measured"] - 1)
        assert (out / f"overlay-{p['name']}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    memory = rows(out / "memory.csv")
    assert {m["name"] for m in memory} == {"calib-interleaved", *heldout}
    for m in memory:
        run = json.loads((out / "runs" / m["name"] / "summary.json").read_text())
        parts = sum(int(m[k]) for k in ("weights", "gradients", "batch", "activations", "receive_buffers",
                                        "send_buffers"))
        assert int(m["predicted"]) == parts and m["measured"] == ""  # no CUDA: nothing measured
        rank = int(m["rank"])
        layers = sum(b - a for s in run["stage_costs"] if s["rank"] == rank for a, b in [s["layers"]])
        assert int(m["weights"]) == int(m["gradients"]) == layers * LAYER_BYTES
        assert int(m["batch"]) == 2 * run["microbatches"] * ROWS * HIDDEN * 4  # inputs and targets
        assert int(m["activations"]) > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["environment"]["gpus"] == 0 and summary["problems"] == []


def test_read_steps_and_a_bad_role(tmp_path):
    path = tmp_path / "steps.tsv"
    path.write_text("a\tcheck\t0\t1.5\nb\theldout\t124\t120.0\n")
    assert R.read_steps(path) == [R.Step("a", "check", 0, 1.5), R.Step("b", "heldout", 124, 120.0)]
    path.write_text("a\tbogus\t0\t1\n")
    with pytest.raises(ValueError, match="unknown role 'bogus'"):
        R.read_steps(path)
    assert R.read_steps(tmp_path / "absent.tsv") == []


def test_check_rows_from_summaries_and_logs(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("running ...\nrank 1: error: the schedule needs 4 ranks but the world has 2\ntorchrun: exit 2\n")
    row = R.check_row("x", None, log)
    assert (row.verdict, row.detail) == ("ERROR", "rank 1: error: the schedule needs 4 ranks but the world has 2")
    summary = {"schedule": "1f1b", "ranks": 2, "microbatches": 4, "chunks": 1, "check": {
        "passed": False, "tolerance": 1e-4, "max_relative_error": 0.5, "worst_parameter": "layer0.weight",
        "loss_relative_error": 0.0, "parameters_missing": ["layer3.bias"]}}
    row = R.check_row("y", summary, log)
    assert (row.verdict, row.max_relative_error, row.detail) == ("FAILED", 0.5, "no gradient for layer3.bias")


def test_size_picks_the_largest_unit():
    assert [R.size(x) for x in (None, 512, 1536, 3 << 20, 5 << 30)] == [
        "n/a", "512 B", "1.50 KiB", "3.00 MiB", "5.00 GiB"]


def test_report_format_on_a_gpu():
    env = {"gpus": 1, "device": "NVIDIA H200", "backend": "nccl", "torch": "2.5.1+cu124", "cuda": "12.4",
           "nccl": "2.21.5"}
    steps = [R.Step("p1-interleaved", "check", 0, 20.0), R.Step("heldout-gpipe", "heldout", 124, 150.0),
             R.Step("sim-plot", "sim", -1, 0.0)]
    checks = [R.CheckRow("p1-interleaved", "interleaved", 1, 4, 2, "PASSED", 2.5e-7, "layer1.weight", 0.0, 1e-4, "")]
    predictions = [R.PredictionRow("heldout-1f1b", "1f1b", 4, 16, 1, 0.020, 0.019, -0.05, -0.04, 0.012, 0.2, 0.18)]
    memory = [R.MemoryRow("calib", 0, 1000 << 20, 1100 << 20, 300 << 20, 300 << 20, 100 << 20, 350 << 20,
                          50 << 20, 0)]
    text = R.format_report(env, steps, checks, predictions, memory, "interleaved p=4 m=8 v=2 (runs/x)", Path("o"))
    lines = text.splitlines()
    assert lines[0] == "GPU check: 1 x NVIDIA H200; backend nccl; torch 2.5.1+cu124, CUDA 12.4, NCCL 2.21.5"
    assert lines[1] == ("steps: 1 of 3 ran cleanly in 170 s; heldout-gpipe timed out (exit 124); "
                        "sim-plot not run (time budget spent)")
    assert lines[3].split() == ["p1-interleaved", "interleaved", "p=1", "m=4", "v=2", "PASSED", "grad",
                                "2.50e-07", "loss", "0.00e+00"]
    assert lines[4] == "predictions (calibrated on interleaved p=4 m=8 v=2 (runs/x)):"
    assert "step 20.00 ms measured, 19.00 simulated (-5.0%); makespan -4.0%" in lines[5]
    assert lines[7].split(": ", 1)[1] == (
        "1000.00 MiB vs 1.07 GiB (+10.0%) = 300.00 MiB + 300.00 MiB + 100.00 MiB + 350.00 MiB + 50.00 MiB + 0 B")


def test_report_fails_on_a_failed_check(tmp_path):
    (tmp_path / "runs" / "c").mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "steps.tsv").write_text("c\tcheck\t1\t3.0\n")
    (tmp_path / "runs" / "c" / "summary.json").write_text(json.dumps({
        "schedule": "gpipe", "ranks": 2, "microbatches": 2, "chunks": 1, "check": {
            "passed": False, "tolerance": 1e-4, "max_relative_error": 0.1, "worst_parameter": "w",
            "loss_relative_error": 0.2, "parameters_missing": []}}))
    assert R.report(tmp_path) == 1
    assert rows(tmp_path / "checks.csv")[0]["verdict"] == "FAILED"
    assert "FAILED" in (tmp_path / "report.txt").read_text()


def test_report_refuses_a_missing_folder(tmp_path, capsys):
    assert R.main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err
