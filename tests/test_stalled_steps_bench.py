"""bench/stalled_steps.py: the fence's two replays on a synthetic stalled run, one real run, bad flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripts import load_script
from test_calibrate import write_run

from sim.measured import read_measured

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "stalled_steps.py"


def test_self_replay_with_the_fence_is_exact_and_without_it_long(tmp_path):
    """A synthetic run (test_calibrate's machine) whose steps 1 and 6 of 12 ran 3x slower: fenced
    off, the calibration is the machine's and replays the run exactly; kept in, their longer gaps
    and transfers lengthen the replay."""
    bench = load_script(SCRIPT)
    write_run(tmp_path / "run", "1f1b", 4, steps=12, profile=True, stalls={1: 3.0, 6: 3.0})
    run = read_measured(tmp_path / "run")
    assert abs(bench.self_replay(run, fence=True)) < 1e-12
    assert bench.self_replay(run, fence=False) > 0.03


def test_a_real_run_prints_its_row_and_the_summary(tmp_path, monkeypatch, capsys):
    bench = load_script(SCRIPT)
    monkeypatch.setattr(bench, "LOCK", str(tmp_path / "cpu.lock"))
    assert bench.main(["--out", str(tmp_path / "runs"), "--runs", "1", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3].endswith("of 4") and cells[4].endswith("%") and cells[5].endswith("%")
    assert "runs spread at most 0.5" in out or "no run spread at most 0.5" in out


@pytest.mark.parametrize("flags", [["--steps", "3"], ["--runs", "0"]])
def test_bad_flags_get_one_line_and_exit_2(tmp_path, capsys, flags):
    bench = load_script(SCRIPT)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--out", str(tmp_path), *flags])
    assert exc.value.code == 2
    assert "--steps at least 4" in capsys.readouterr().err


def test_a_run_directory_that_cannot_be_made_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    bench = load_script(SCRIPT)
    monkeypatch.setattr(bench, "LOCK", str(tmp_path / "cpu.lock"))
    assert bench.main(["--out", "/proc/no-such-dir", "--runs", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stalled_steps: ") and "/proc/no-such-dir" in err[0]
