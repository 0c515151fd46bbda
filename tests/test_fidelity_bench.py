"""bench/fidelity.py's summary of a sweep: MAPE, largest error, predictions inside the rounds'
range and the ordering check, on a hand-made table whose answers are counted by hand."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "fidelity.py"


def table() -> pd.DataFrame:
    """One group, m=2: A measured 10 ms (rounds 9-11), B 20 (19-21), C 10.5 (10-11, overlapping A).
    Predicted: A 10.5 (+5%, inside), B 16 (-20%, outside), C 12.6 (+20%, outside)."""
    rows = [("a", 10.0, 9.0, 11.0, 10.5), ("b", 20.0, 19.0, 21.0, 16.0), ("c", 10.5, 10.0, 11.0, 12.6)]
    return pd.DataFrame([{"group": "g", "schedule": s, "m": 2, "measured_ms": mid, "q1_ms": lo, "q3_ms": hi,
                          "spread": 0.1, "pred_three_ms": pred, "err_three": pred / mid - 1}
                         for s, mid, lo, hi, pred in rows])


def test_summary_counts_by_hand():
    bench = load_script(SCRIPT)
    entry = bench.summarize(table())["groups"]["g"]["three"]
    assert entry["mape"] == pytest.approx((0.05 + 0.20 + 0.20) / 3)
    assert entry["largest"] == pytest.approx(-0.20) and entry["largest_case"] == "b m=2"
    assert (entry["inside_rounds"], entry["cases"]) == (1, 3)
    # pairs whose ranges do not overlap: a/b and b/c; both ordered as measured (b slower)
    assert entry["ordering"] == {"pairs": 2, "agreed": 2, "missed": []}


def test_ordering_names_a_pair_predicted_the_wrong_way_round():
    bench = load_script(SCRIPT)
    t = table()
    t.loc[t["schedule"] == "b", "pred_three_ms"] = 11.0  # now between a and c: b/c turned round, a/b not
    assert bench.ordering(t, "pred_three_ms") == {"pairs": 2, "agreed": 1, "missed": ["b/c m=2"]}


def test_diagnose_refuses_a_missing_run_with_one_line(tmp_path, capsys):
    """bench/fidelity_diagnose.py: a run directory that does not exist is one line on stderr and exit 2."""
    diagnose = load_script(SCRIPT.parent / "fidelity_diagnose.py")
    assert diagnose.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not exist" in err


def test_diagnose_replays_a_synthetic_run_with_its_own_sends_exactly(tmp_path, monkeypatch):
    """On a run the engine made (test_calibrate's machine with its two ranks on one core, where a
    SEND whose receiver waits costs 300 us more), the replays with compute and transfers as
    measured are exact with each SEND's own gap and with the calibration's (send, wake), and
    miss with one constant (the mean gap) where the two kinds of SEND differ."""
    import test_calibrate

    from sim.calibration import calibrate
    from sim.engine import compile_program
    from sim.measured import read_measured

    monkeypatch.setattr(test_calibrate, "WAKE", 300e-6)
    monkeypatch.setattr(test_calibrate, "CORES", 1)
    monkeypatch.setattr(test_calibrate, "DISPATCH", 0.0)  # a measured row ends at its action's end
    test_calibrate.write_run(tmp_path / "run", "1f1b", 8, profile=True, clocks="host")
    diagnose = load_script(SCRIPT.parent / "fidelity_diagnose.py")
    run = read_measured(tmp_path / "run")
    cal = calibrate(run)
    errors = diagnose.measured_sends(run, cal, compile_program(run.program, cal.for_run(run).for_schedule(
        run.program.schedule)))
    assert abs(errors["own"]) < 1e-9 and abs(errors["model"]) < 1e-9
    assert abs(errors["mean"]) > 2e-3


def test_an_unknown_group_is_refused_before_any_run(tmp_path):
    """A misspelt --groups name used to select nothing and end with empty tables; now it is an
    error naming it, before the output directory is made."""
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--groups", "mlp-8-p2", "mlp-3-p2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown group(s) mlp-3-p2" in done.stderr and "mlp-2-p4" in done.stderr
    assert not out.exists()


def test_an_unknown_case_to_skip_is_refused_before_any_run(tmp_path):
    """--skip names a held-out case as GROUP:SCHEDULE-mM with m = p or 4p; anything else (here m=8 at
    p=4, which the sweep never runs) is an error naming it, before the output directory is made."""
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--groups", "gpt-256-p4",
                           "--skip", "gpt-256-p4:gpipe-m16", "--skip", "gpt-256-p4:gpipe-m8"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown case(s) to skip gpt-256-p4:gpipe-m8" in done.stderr
    assert "gpipe-m16" not in done.stderr.split("unknown case(s) to skip")[1].split(";")[0]
    assert not out.exists()
