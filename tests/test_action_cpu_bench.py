"""bench/action_cpu.py: each run's CPU over the pooled medians, per microbatch and over the cores'
time, and the gap table, in closed form on two hand-made runs; one clear line for bad input."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "action_cpu.py"
MS = 1e-3


def hand_made(name: str, b_cpu: float, process: float):
    """One step of one rank, stage 0: F over [0, 1] ms, F 20 us after it (a repeat), B 1.5 ms
    after that (a switch); thread CPU 1.0, 0.5 and `b_cpu` ms; its process `process` ms of CPU
    in a 5 ms step on 2 cores, with 1 microbatch."""
    timeline = pd.DataFrame({"step": 0, "rank": 0, "stage": 0, "kind": ["F", "F", "B"],
                             "start": [0.0, 1.02 * MS, 3.52 * MS], "end": [1.0 * MS, 2.02 * MS, 5.0 * MS]})
    cpu = pd.Series([1.0 * MS, 0.5 * MS, b_cpu * MS], index=timeline.index)
    summary = {"microbatches": 1, "process_cpu_seconds": [[process * MS]], "cpu_cores": 2}
    return SimpleNamespace(path=Path(name), timeline=timeline, thread_cpu=cpu, summary=summary, step_times=[5.0 * MS])


def test_cpu_over_the_pooled_median_and_per_microbatch_in_closed_form() -> None:
    """Pooled medians: F over 1.0, 0.5, 1.0, 0.5 ms is 0.75; B over 2 and 3 ms is 2.5. Run a's
    actions come out 4/3, 2/3 and 0.8 of them (mean 14/15), run b's 4/3, 2/3 and 1.2 (16/15);
    run a computes 3.5 ms in its one microbatch and its process used 1 ms more, 4.5 ms of the
    cores' 10."""
    bench = load_script(SCRIPT)
    runs = [hand_made("a", 2.0, 4.5), hand_made("b", 3.0, 5.5)]
    frames = bench.relative([bench.action_rows(run) for run in runs])
    assert frames[0]["rel"].tolist() == pytest.approx([4 / 3, 2 / 3, 0.8])
    assert frames[1]["rel"].tolist() == pytest.approx([4 / 3, 2 / 3, 1.2])
    a, b = (bench.run_line(run, rows) for run, rows in zip(runs, frames))
    assert a["cpu_over_pooled"] == pytest.approx(14 / 15) and b["cpu_over_pooled"] == pytest.approx(16 / 15)
    assert a["compute_ms_per_microbatch"] == pytest.approx(3.5) and b["compute_ms_per_microbatch"] == pytest.approx(4.5)
    assert a["other_ms_per_microbatch"] == pytest.approx(1.0) and b["other_ms_per_microbatch"] == pytest.approx(1.0)
    assert a["cores_busy"] == pytest.approx(0.45) and b["cores_busy"] == pytest.approx(0.55)


def test_gap_table_bins_repeats_and_switches_by_the_gap_before_them() -> None:
    """The repeated F (20 us after its predecessor) of both runs at 2/3, the B (1.5 ms after the
    F before it, a switch) at 0.8 and 1.2: median 1.0; each step's first action has no gap."""
    bench = load_script(SCRIPT)
    frames = bench.relative([bench.action_rows(run) for run in (hand_made("a", 2.0, 4.5), hand_made("b", 3.0, 5.5))])
    table = bench.gap_table(pd.concat(frames))
    assert table.loc[(True, "<50us"), "median"] == pytest.approx(2 / 3) and table.loc[(True, "<50us"), "size"] == 2
    assert table.loc[(False, ">1ms"), "median"] == pytest.approx(1.0) and table.loc[(False, ">1ms"), "size"] == 2
    assert int(table["size"].sum()) == 4


def test_main_prints_both_tables(monkeypatch, capsys) -> None:
    bench = load_script(SCRIPT)
    runs = {"a": hand_made("a", 2.0, 4.5), "b": hand_made("b", 3.0, 5.5)}
    monkeypatch.setattr(bench, "read_measured", lambda path: runs[path])
    monkeypatch.setattr(sys, "argv", ["action_cpu.py", "a", "b"])
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "| a | 1 | 3 | 0.933 | 3.50 | 1.00 | 0.45 |" in out
    assert "| b | 1 | 3 | 1.067 | 4.50 | 1.00 | 0.55 |" in out
    assert "| repeat | 0.67 (2) |" in out


def test_a_run_without_cpu_csv_is_one_clear_line(monkeypatch, capsys) -> None:
    bench = load_script(SCRIPT)
    run = hand_made("old", 2.0, 4.5)
    run.thread_cpu = None
    monkeypatch.setattr(bench, "read_measured", lambda path: run)
    monkeypatch.setattr(sys, "argv", ["action_cpu.py", "old"])
    assert bench.main() == 2
    err = capsys.readouterr().err
    assert err.startswith("error: old: no cpu.csv") and err.count("\n") == 1


def test_a_missing_run_is_one_clear_line(tmp_path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "absent")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:")
    assert "Traceback" not in done.stderr
