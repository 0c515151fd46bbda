"""Run lengths (schedules.analysis.run_lengths) in closed form, and bench/repeat_costs.py tabulating a
synthetic machine's repeats exactly.

Synthetic runs come from tests/test_calibrate.py's `write_run` (the simulator under a known
machine whose switch costs are SWITCH), so every measured and modelled value is known.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import schedules
import test_calibrate as synth
from schedules import Action, Kind
from schedules.analysis import run_lengths, stage_switches
from test_calibrate import write_run

from sim.calibration import calibrate_runs
from sim.measured import read_measured
from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "repeat_costs.py"


def load_bench():
    return load_script(SCRIPT)


@pytest.mark.parametrize("m", [1, 3, 6])
def test_gpipe_runs_count_up_through_each_phase(m):
    stream = schedules.lower(schedules.build("gpipe", ranks=2, microbatches=m)).streams[0]
    lengths = [n for a, n in zip(stream, run_lengths(stream)) if a.kind.is_compute]
    assert lengths == list(range(1, m + 1)) * 2  # m forwards in a row, then m backwards


def test_one_f_one_b_steady_state_switches_every_action():
    stream = schedules.lower(schedules.build("1f1b", ranks=2, microbatches=6)).streams[1]
    assert [n for a, n in zip(stream, run_lengths(stream)) if a.kind.is_compute] == [1] * 12


def test_a_stage_switch_is_a_compute_action_after_another_stages():
    # rank 0 of an interleaved-like stream: its stages 0 and 2, transfers between computes
    stream = [Action(0, Kind.F, 0), Action(0, Kind.SEND_F, 0), Action(2, Kind.F, 0), Action(2, Kind.B, 0),
              Action(2, Kind.RECV_B, 1), Action(0, Kind.B, 0), Action(0, Kind.W, 0), Action(2, Kind.W, 0)]
    assert stage_switches(stream) == [False, False, True, False, False, True, False, True]


def test_one_stage_per_rank_never_switches_stage():
    for name in ("gpipe", "1f1b", "zb-h1"):
        for stream in schedules.lower(schedules.build(name, ranks=3, microbatches=6)).streams:
            assert not any(stage_switches(stream))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("repeats")
    write_run(root / "1f1b", "1f1b", 8, profile=True)
    write_run(root / "gpipe", "gpipe", 8, profile=True)
    return root


def test_gpipe_repeats_cost_the_switch_less_and_match_a_1f1b_calibration(runs):
    bench = load_bench()
    calibration = calibrate_runs([read_measured(runs / "1f1b")])
    table = bench.repeat_table(str(runs / "gpipe"), calibration)
    assert set(table["length"]) == {"3+"}  # places 2 and later of a GPipe phase repeat
    assert table["measured_us"].to_numpy() == pytest.approx(table["modelled_us"].to_numpy(), rel=1e-9)
    # a switching action of the 1F1B run costs its stage's repeat in GPipe plus SWITCH
    steady = bench.repeat_table(str(runs / "1f1b"), None)
    for kind in ("F", "B"):
        for stage in (0, 1):
            on = steady[(steady.kind == kind) & (steady.stage == stage) & (steady.length == "1 kind")]["measured_us"]
            off = table[(table.kind == kind) & (table.stage == stage)]["measured_us"]
            assert float(on.iloc[0]) - float(off.iloc[0]) == pytest.approx(synth.SWITCH[kind] * 1e6, rel=1e-6)


def test_cli_prints_one_row_per_cell_and_refuses_a_missing_run(runs, tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(runs / "gpipe"), "--calibrate-on", str(runs / "1f1b")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| gpipe |")]
    assert len(rows) == 4 + 2 and all(line.endswith("| x1.00 |") for line in rows)  # cells, then kinds
    missing = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nothing")], capture_output=True, text=True)
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith("error: ")
    write_run(tmp_path / "short", "gpipe", 2, profile=True)  # places 0 and 1 only
    short = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "short")], capture_output=True, text=True)
    assert short.returncode == 1 and short.stderr.count("\n") == 1 and "m >= 3" in short.stderr


def test_a_machine_whose_long_runs_get_cheaper_is_tabulated_exactly_once_a_gpipe_run_tells_it(tmp_path, monkeypatch):
    """The machine's k-th repeat costs its stage cost times 1 - 0.3 (1 - 1/(k-1)) from k=3: modelled
    by the calibration of its 1F1B and GPipe runs, GPipe's repeats match exactly; by the 1F1B run
    alone (which cannot tell the discount), they come out cheaper than modelled."""
    monkeypatch.setitem(synth.DISCOUNT, "F", 0.3)
    monkeypatch.setitem(synth.DISCOUNT, "B", 0.3)
    write_run(tmp_path / "1f1b", "1f1b", 8, profile=True)
    write_run(tmp_path / "gpipe", "gpipe", 8, profile=True)
    bench = load_bench()
    both = calibrate_runs([read_measured(tmp_path / "1f1b"), read_measured(tmp_path / "gpipe")])
    table = bench.repeat_table(str(tmp_path / "gpipe"), both)
    assert table["measured_us"].to_numpy() == pytest.approx(table["modelled_us"].to_numpy(), rel=1e-6)
    alone = bench.repeat_table(str(tmp_path / "gpipe"), calibrate_runs([read_measured(tmp_path / "1f1b")]))
    assert (alone["measured_us"] < 0.95 * alone["modelled_us"]).all()


@pytest.mark.parametrize("name, chunks", [("interleaved", 2), ("zbv", None), ("zb-h1", None)])
def test_stage_and_kind_switches_and_split_forwards_are_tabulated_exactly(tmp_path, monkeypatch, name, chunks):
    """A synthetic run calibrated on itself and a 1F1B run (which tells the backward's switch: a
    ZB-H1 run alone, whose I and W nearly all switch, cannot): every cell, the stage switches of a
    rank holding two stages and the split forwards of a zero-bubble run among them, costs what
    the model charges."""
    monkeypatch.setattr(synth, "SPLIT_FACTOR", 1.15)  # a split forward dearer than a plain one
    write_run(tmp_path / name, name, 8, chunks=chunks, profile=True)
    write_run(tmp_path / "1f1b", "1f1b", 8, profile=True)
    calibration = calibrate_runs([read_measured(tmp_path / "1f1b"), read_measured(tmp_path / name)])
    table = load_bench().repeat_table(str(tmp_path / name), calibration)
    assert table["measured_us"].to_numpy() == pytest.approx(table["modelled_us"].to_numpy(), rel=1e-6)
    assert ("1 stage" in set(table["length"])) == (name != "zb-h1")
