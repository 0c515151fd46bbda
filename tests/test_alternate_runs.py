"""bench/alternate_runs.py: several runs in one launch, their steps alternated. The order is checked
by hand, a bad plan gets one line and exit 2, and a real two-rank launch writes run directories
whose peak activation bytes are those of the same runs made alone (each run's meter counts its
own tensors, whatever else the launch holds open)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ranks import free_port, rank_env
from scripts import load_script

from sim.measured import read_measured

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "alternate_runs.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
MODEL = {"model": "mlp", "layers": 4, "hidden": 16}


def test_step_order_spreads_every_run_over_the_launch():
    bench = load_script(SCRIPT)
    # run 0's steps at 1/4 and 3/4 of the launch, run 1's at 1/8, 3/8, 5/8, 7/8
    assert bench.step_order([2, 4]) == [1, 0, 1, 1, 0, 1]
    # equal counts: a plain rotation, ties broken by run
    assert bench.step_order([3, 3, 3]) == [0, 1, 2] * 3


@pytest.mark.parametrize("text, says", [
    ("not json", "not a plan"),
    (json.dumps({"model": MODEL, "runs": []}), "at least one run"),
    (json.dumps({"model": MODEL, "runs": [{"out": "x", "schedule": "1f1b", "microbatches": 2, "batch_size": 4,
                                            "steps": 0}]}), "at least one step"),
    (json.dumps({"model": MODEL, "runs": [{"out": "x", "schedule": "1f1b"}]}), "not a plan"),
])
def test_a_bad_plan_is_one_line_and_exit_2(tmp_path, capsys, text, says):
    bench = load_script(SCRIPT)
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert bench.main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                           str(free_port()), *args], capture_output=True, text=True, timeout=300, env=rank_env(),
                          cwd=ROOT)


def test_alternated_runs_hold_the_bytes_of_runs_made_alone(tmp_path):
    runs = [("1f1b", 4, None, 3, True), ("interleaved", 4, 2, 2, False), ("zb-h1", 2, None, 2, False)]
    plan = {"model": MODEL, "warmup": 1, "rewarm": 1,
            "runs": [{"out": str(tmp_path / f"alt-{s}"), "schedule": s, "microbatches": m, "chunks": v,
                      "batch_size": 2 * m, "steps": n, "profile": profile} for s, m, v, n, profile in runs]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = torchrun(str(SCRIPT), str(tmp_path / "plan.json"))
    assert done.returncode == 0, done.stderr
    for schedule, m, chunks, steps, profile in runs:
        alternated = read_measured(tmp_path / f"alt-{schedule}")
        assert len(alternated.step_times) == steps
        assert (tmp_path / f"alt-{schedule}" / "profile.json").is_file() == profile
        alone = tmp_path / f"alone-{schedule}"
        flags = ["--chunks", str(chunks)] if chunks else []
        done = torchrun("-m", "runtime", "--schedule", schedule, "--microbatches", str(m), *flags,
                        "--model", "mlp", "--layers", "4", "--hidden", "16", "--batch-size", str(2 * m),
                        "--steps", "1", "--out", str(alone))
        assert done.returncode == 0, done.stderr
        bytes_alone = json.loads((alone / "summary.json").read_text())["peak_activation_bytes"]
        bytes_alternated = json.loads((tmp_path / f"alt-{schedule}" / "summary.json").read_text())["peak_activation_bytes"]
        assert bytes_alternated == bytes_alone, schedule
