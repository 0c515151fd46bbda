"""`python -m runtime launch`: torchrun's flags and the executor's in one command line, the
ranks' error lines printed last, the first failed rank's exit code (two ranks, tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from torch.distributed.run import get_args_parser

from runtime.launch import exit_code, split_argv

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--layers", "2", "--hidden", "16", "--batch-size", "4", "--steps", "1", "--warmup", "0"]


def launch(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "runtime", "launch", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240, check=False)


def test_flags_are_told_apart_by_torchruns_own_parser() -> None:
    ours, theirs = split_argv(
        ["--nproc-per-node", "2", "--schedule", "1f1b", "--rdzv-endpoint=h:1", "--standalone", "--steps", "3"],
        get_args_parser(),
    )
    assert ours == ["--nproc-per-node", "2", "--rdzv-endpoint=h:1", "--standalone"]
    assert theirs == ["--schedule", "1f1b", "--steps", "3"]


def test_a_signal_reads_as_the_shell_reports_it() -> None:
    class Failure:
        exitcode = -9

    assert exit_code(Failure()) == 128 + 9


def test_launch_runs_the_executor_and_puts_the_ranks_errors_last(tmp_path) -> None:
    done = launch("--nproc-per-node", "2", "--schedule", "1f1b", "--microbatches", "2", *TINY,
                  "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["ranks"] == 2
    # A bad configuration: every rank prints one line and exits 2 (runtime/cli.py); those lines
    # come last, after torchrun's own report, and the launcher exits 2 too.
    done = launch("--nproc-per-node", "2", "--schedule", "nope", "--microbatches", "2", *TINY, cwd=tmp_path)
    assert done.returncode == 2
    # (A rank the launcher stops before it prints is reported by its exit code instead.)
    last = done.stderr.strip().splitlines()[-2:]
    assert [line.split(":")[0] for line in last] == ["rank 0", "rank 1"]
    assert "error: unknown schedule 'nope'" in last[0]
