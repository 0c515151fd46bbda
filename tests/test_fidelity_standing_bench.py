"""bench/fidelity_standing.py: each group from the file named for it, its MAPE and largest error in
closed form, and one clear line for a group a file lacks or a malformed argument."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "fidelity_standing.py"


def results(path: Path, group: str, errors: list[float]) -> None:
    """A results.csv of one group: schedules a, b, c at m=2 measured 10, 20 and 30 ms (rounds
    apart), predicted with `errors`."""
    measured = [10.0, 20.0, 30.0]
    pd.DataFrame({"group": group, "model": "mlp", "schedule": ["a", "b", "c"], "m": 2, "measured_ms": measured,
                  "q1_ms": [m * 0.99 for m in measured], "q3_ms": [m * 1.01 for m in measured], "spread": 0.1,
                  "pred_three_ms": [m * (1 + e) for m, e in zip(measured, errors)], "err_three": errors}).to_csv(path, index=False)


def two_groups(tmp_path: Path) -> list[str]:
    """Group x in one file (errors +3, -6, +9%: MAPE 6%, largest +9%) and y in another (+1%, -1%,
    +1%, and c predicted below b, so 2 of the 3 pairs apart are ordered as measured); the
    arguments that take each from its own file."""
    results(tmp_path / "one.csv", "x", [0.03, -0.06, 0.09])
    results(tmp_path / "two.csv", "y", [0.01, -0.01, -0.40])
    return [f"{tmp_path / 'one.csv'}:x", f"{tmp_path / 'two.csv'}:y"]


def assert_two_groups(out: str, tmp_path: Path) -> None:
    assert f"| x | {tmp_path / 'one.csv'} | 3 | 6.0% | +9.0% (c m=2) | 3/3 |" in out
    assert f"| y | {tmp_path / 'two.csv'} | 3 | 14.0% | -40.0% (c m=2) | 2/3 |" in out


def standing(monkeypatch, capsys, *argv: str) -> str:
    """What the script prints for `argv`, in this process; it must exit 0."""
    monkeypatch.setattr(sys, "argv", ["fidelity_standing.py", *argv])
    assert load_script(SCRIPT).main() == 0
    return capsys.readouterr().out


def test_each_group_from_its_own_file_in_closed_form(tmp_path, capsys, monkeypatch) -> None:
    """`two_groups`, each from its file; the same group in the first file is not taken."""
    figure = tmp_path / "standing.png"
    out = standing(monkeypatch, capsys, *two_groups(tmp_path), "--figure", str(figure))
    assert_two_groups(out, tmp_path)
    assert "6 cases: mean absolute error 10.0%, 3 within 5%" in out  # +3%, +1% and -1%
    assert figure.stat().st_size > 0


def test_gather_keeps_only_the_named_groups(tmp_path) -> None:
    bench = load_script(SCRIPT)
    results(tmp_path / "one.csv", "x", [0.0, 0.0, 0.0])
    table = bench.gather([bench.parse_source(f"{tmp_path / 'one.csv'}:x")])
    assert list(table["group"].unique()) == ["x"] and len(table) == 3
    with pytest.raises(ValueError, match="no group z"):
        bench.gather([bench.parse_source(f"{tmp_path / 'one.csv'}:z")])
    with pytest.raises(ValueError, match="named twice"):
        bench.gather([bench.parse_source(f"{tmp_path / 'one.csv'}:x,x")])


def test_a_written_standing_reads_back_with_its_sources(tmp_path, capsys, monkeypatch) -> None:
    """--write keeps the gathered rows with the file each came from; that table named alone (no
    groups: all of them) gives the same standing, each group still from its own sweep."""
    table = tmp_path / "standing.csv"
    first = standing(monkeypatch, capsys, *two_groups(tmp_path), "--write", str(table))
    again = standing(monkeypatch, capsys, str(table))
    assert_two_groups(again, tmp_path)
    assert again == first.replace(f"wrote {table}\n", "")
    assert list(pd.read_csv(table)["source"].unique()) == [str(tmp_path / "one.csv"), str(tmp_path / "two.csv")]


def test_an_unwritable_output_is_one_clear_line(tmp_path) -> None:
    sources = two_groups(tmp_path)
    done = subprocess.run([sys.executable, str(SCRIPT), *sources, "--write", str(tmp_path / "absent" / "s.csv")],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:") and "absent" in done.stderr


def test_a_table_without_groups_is_one_clear_line(tmp_path) -> None:
    pd.DataFrame({"schedule": ["a"]}).to_csv(tmp_path / "odd.csv", index=False)
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "odd.csv")], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == f"error: {tmp_path / 'odd.csv'} is not a results table (it has no group column)\n"


@pytest.mark.parametrize("argument", ["file.csv:", ":group"])
def test_a_malformed_argument_is_one_clear_line(argument: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), argument], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("suffix", [":x", ""])
def test_a_missing_file_is_one_clear_line(tmp_path, suffix: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), f"{tmp_path / 'absent.csv'}{suffix}"], capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error:")


def test_a_calibration_with_no_predictions_is_one_clear_line(tmp_path) -> None:
    """A group whose cases the calibration could not predict (every error NaN) has nothing to
    average: one line, not a division by zero."""
    results(tmp_path / "one.csv", "x", [float("nan")] * 3)
    done = subprocess.run([sys.executable, str(SCRIPT), f"{tmp_path / 'one.csv'}:x"], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == "error: no three predictions in the results given\n"
