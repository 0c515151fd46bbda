"""`python -m sim compare` and `python -m sim sweep`: outputs, options and one-line errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pandas as pd
import pytest

import schedules
from schedules import ScheduleError
from sim import CostModel
from sim.__main__ import main

JSON_KEYS = {
    "schedule", "ranks", "microbatches", "chunks", "makespan", "bubble_ratio", "bubble_ratio_rank_span",
    "peak_activation", "peak_activation_per_rank", "peak_activation_bytes",
}


def legal_at(p: int, m: int, v: int) -> list[str]:
    out = []
    for name in schedules.available():
        chunks = v if schedules.generator(name).chunks is None else None
        try:
            schedules.build(name, ranks=p, microbatches=m, chunks=chunks)
        except ScheduleError:
            continue
        out.append(name)
    return out


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_module_entry_point_runs_compare_with_no_arguments() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sim", "compare"], capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    # The defaults are said first, then the table, then which memory numbers are bytes.
    assert lines[0].startswith("p=4 ranks, m=8 microbatches, v=2")
    assert "F = 1 s, I = 1 s, W = 1 s" in lines[1] and "defaults" in lines[1]
    assert lines[2].split()[:4] == ["schedule", "ranks", "microbatches", "chunks"]
    assert [line.split()[0] for line in lines[3:-1]] == legal_at(4, 8, 2)
    assert lines[-1].startswith("memory: ")


def test_compare_json(capsys) -> None:
    code, out, _ = run_cli(capsys, "compare", "--json")
    assert code == 0
    records = json.loads(out)
    assert [r["schedule"] for r in records] == legal_at(4, 8, 2)
    for record in records:
        assert JSON_KEYS <= set(record)
        assert (record["ranks"], record["microbatches"]) == (4, 8)
        assert record["peak_activation"] == max(record["peak_activation_per_rank"])
        assert len(record["peak_activation_per_rank"]) == 4
    by_name = {r["schedule"]: r for r in records}
    # Default costs F = I = W = 1 (fused B = 2): closed forms of the schedules issue 3 names.
    assert by_name["1f1b"]["bubble_ratio"] == pytest.approx(3 / 11, rel=1e-12)
    assert by_name["1f1b"]["makespan"] == pytest.approx(11 * 3.0)
    assert by_name["1f1b"]["peak_activation_per_rank"] == [4, 3, 2, 1]
    assert by_name["interleaved"]["chunks"] == 2
    assert by_name["interleaved"]["bubble_ratio"] == pytest.approx(3 / 19, rel=1e-12)
    assert by_name["gpipe"]["chunks"] == 1 and by_name["gpipe"]["peak_activation"] == 8


def test_compare_csv_and_options(capsys) -> None:
    code, out, _ = run_cli(
        capsys, "compare", "--csv", "--schedules", "gpipe,1f1b", "--ranks", "2", "--microbatches", "3",
        "--forward", "0.5", "--backward", "1", "--weight", "0.5", "--comm-latency", "0.25",
    )
    assert code == 0
    frame = pd.read_csv(io.StringIO(out))
    assert list(frame["schedule"]) == ["gpipe", "1f1b"]
    # GPipe with latency c: (m+p-1)(f+b) + 2(p-1)c, here B = backward + weight = 1.5.
    assert frame.loc[0, "makespan"] == pytest.approx(4 * 2.0 + 2 * 0.25)
    assert frame.loc[0, "time_per_microbatch"] == pytest.approx((4 * 2.0 + 0.5) / 3)


def test_compare_costs_file_and_overrides(capsys, tmp_path) -> None:
    path = tmp_path / "costs.json"
    CostModel(forward=2.0, backward_input=4.0, activation_memory=100).to_json(path)
    _, out, _ = run_cli(capsys, "compare", "--json", "--schedules", "1f1b", "--costs", str(path))
    record = json.loads(out)[0]
    assert record["makespan"] == pytest.approx(11 * 6.0)
    assert record["peak_activation_bytes"] == 400
    _, out, _ = run_cli(capsys, "compare", "--json", "--schedules", "1f1b", "--costs", str(path), "--forward", "1")
    assert json.loads(out)[0]["makespan"] == pytest.approx(11 * 5.0)


def test_compare_chunks_apply_to_schedules_that_take_them(capsys) -> None:
    _, out, _ = run_cli(capsys, "compare", "--json", "--schedules", "1f1b,interleaved", "--chunks", "4")
    assert [r["chunks"] for r in json.loads(out)] == [1, 4]


def test_default_costs_show_what_the_zero_bubble_schedules_are_for(capsys) -> None:
    """Defaults F = I = W = 1 (a transformer's backward, twice the forward, split evenly), p = 4,
    m = 8: 1F1B and GPipe take (m + p - 1)(F + I + W) = 33; ZB-H1 fills W into 1F1B's bubble,
    leaving (p - 1)(F + I - W) per rank (Qi et al. 2024, Sec. 2.2), so m(F + I + W) + 3 = 27;
    ZB-H2's rank spans hold no bubble, (p - 1)(F + I - 2W) = 0; ZB-V beats 1F1B at 1F1B's memory."""
    code, out, _ = run_cli(capsys, "compare", "--json")
    assert code == 0
    by_name = {r["schedule"]: r for r in json.loads(out)}
    p, m, f, i, w = 4, 8, 1.0, 1.0, 1.0
    assert by_name["1f1b"]["makespan"] == pytest.approx((m + p - 1) * (f + i + w))
    assert by_name["gpipe"]["makespan"] == pytest.approx((m + p - 1) * (f + i + w))
    assert by_name["zb-h1"]["makespan"] == pytest.approx(m * (f + i + w) + (p - 1) * (f + i - w))
    assert by_name["zb-h1"]["makespan"] < by_name["1f1b"]["makespan"]
    assert by_name["zb-h1"]["peak_activation"] == by_name["1f1b"]["peak_activation"] == p
    assert by_name["zb-h2"]["bubble_ratio_rank_span"] == 0
    assert by_name["zb-h2"]["makespan"] <= by_name["zb-h1"]["makespan"]
    assert by_name["zbv"]["makespan"] < by_name["zb-h1"]["makespan"]
    assert by_name["zbv"]["peak_activation"] == p


def test_compare_text_headers_carry_units(capsys) -> None:
    _, out, _ = run_cli(capsys, "compare", "--schedules", "1f1b", "--forward", "0.001", "--backward", "0.002",
                        "--weight", "0")
    header = out.splitlines()[2]
    # Costs in seconds, a makespan of (8 + 3) x 3 ms = 33 ms: printed in ms.
    for column in ("makespan [ms]", "per_microbatch [ms]", "bubble_ratio [%]", "rank_span_bubble [%]",
                   "peak_act [microbatches]"):
        assert column in header
    row = out.splitlines()[3].split()
    assert row[0] == "1f1b" and float(row[4]) == pytest.approx(33.0) and float(row[6]) == pytest.approx(300 / 11, abs=0.01)
    # No byte sizes given: no byte column, and the memory line says so.
    assert "GiB" not in header and "no bytes" in out.splitlines()[-1]


def test_compare_skips_illegal_schedules_by_default(capsys) -> None:
    code, out, err = run_cli(capsys, "compare", "--json", "--microbatches", "5")
    assert code == 0
    assert [r["schedule"] for r in json.loads(out)] == legal_at(4, 5, 2)
    assert "skipping interleaved (p=4, m=5, v=2)" in err


def test_compare_skips_a_named_schedule_that_cannot_run_and_fails_only_when_none_is_left(capsys) -> None:
    code, out, err = run_cli(capsys, "compare", "--json", "--schedules", "interleaved,1f1b", "--microbatches", "5")
    assert code == 0
    assert [r["schedule"] for r in json.loads(out)] == ["1f1b"]
    assert "skipping interleaved (p=4, m=5, v=2)" in err and "cannot run m=5" in err
    code, _, err = run_cli(capsys, "compare", "--schedules", "interleaved", "--microbatches", "5")
    assert code == 2 and "no schedule can run at these sizes" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["compare", "--ranks", "0"], "--ranks: expected a positive integer"),
        (["compare", "--forward", "-1"], "forward must be a finite number >= 0"),
        (["compare", "--forward", "nan"], "--forward: expected a finite number"),
        (["compare", "--schedules", "nope"], "unknown schedule 'nope'"),
        (["compare", "--schedules", "interleaved", "--microbatches", "5"], "cannot run m=5"),
        (["compare", "--costs", "/nonexistent/costs.json"], "cannot read /nonexistent/costs.json"),
        (["compare", "--json", "--csv"], "not allowed with"),
        (["sweep", "--microbatches", "4,x"], "expected a positive integer"),
        (["sweep", "--out", "table.txt"], "--out must end in .csv or .json"),
        (["compare", "--comm-bandwidth", "1e9"], "--comm-bandwidth has no effect: no bytes cross"),
        (["sweep", "--comm-bandwidth", "1e9"], "--comm-bandwidth has no effect: no bytes cross"),
        (["nonsense"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_values_exit_2_with_one_line(capsys, argv, message) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors exit through Parser.error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


def test_sweep_table_reads_back_with_pandas(capsys, tmp_path) -> None:
    out = tmp_path / "sweep.csv"
    code, _, err = run_cli(
        capsys, "sweep", "--schedules", "gpipe,interleaved", "--ranks", "2,4", "--microbatches", "4,6",
        "--chunks", "2,3", "--out", str(out),
    )
    assert code == 0
    frame = pd.read_csv(out)
    # gpipe: 2 x 2 configurations; interleaved: m must be a multiple of p, so (2,4), (2,6), (4,4) x v.
    assert len(frame) == 4 + 3 * 2
    assert "skipped 2 of 12 configurations" in err
    assert "sweep" in err and "100%" in err  # the progress bar
    row = frame[(frame.schedule == "interleaved") & (frame.ranks == 2) & (frame.microbatches == 6) & (frame.chunks == 3)]
    assert row["bubble_ratio"].item() == pytest.approx(1 / (3 * 6 + 1), rel=1e-12)
    assert frame["actions"].dtype.kind == "i"


def test_sweep_json_and_stdout(capsys, tmp_path) -> None:
    out = tmp_path / "sweep.json"
    assert main(["sweep", "--schedules", "1f1b", "--microbatches", "4,8", "--out", str(out), "--no-progress"]) == 0
    frame = pd.read_json(out)
    assert list(frame["microbatches"]) == [4, 8]
    capsys.readouterr()
    code, stdout, err = run_cli(capsys, "sweep", "--schedules", "1f1b", "--microbatches", "8", "--no-progress")
    assert code == 0 and err == ""
    table = pd.read_csv(io.StringIO(stdout))
    assert table["bubble_ratio"].item() == pytest.approx(3 / 11, rel=1e-12)


def test_activation_bytes_and_weight_memory_fraction_flags(capsys) -> None:
    """--activation-bytes A: 1F1B's rank 0 holds p microbatches, GPipe's m (closed forms), so the
    byte column reads p A and m A, and the output says these are real bytes."""
    mib = 2**20
    code, out, _ = run_cli(capsys, "compare", "--schedules", "gpipe,1f1b", "--activation-bytes", str(mib))
    assert code == 0
    lines = out.splitlines()
    assert "activations 1 MiB per microbatch and rank share" in lines[1]
    assert "peak_act [microbatches]  peak_act [MiB]" in lines[2]
    assert [float(line.split()[9]) for line in lines[3:5]] == [8.0, 4.0]
    assert lines[-1].startswith("memory: peak_act [MiB] is real bytes")
    _, out, _ = run_cli(capsys, "compare", "--json", "--schedules", "zb-h1", "--activation-bytes", "1000")
    without = json.loads(out)[0]
    _, out, _ = run_cli(capsys, "compare", "--json", "--schedules", "zb-h1", "--activation-bytes", "1000",
                        "--weight-memory-fraction", "1")
    kept = json.loads(out)[0]
    # W keeping every byte until it runs holds each microbatch from F to W instead of F to I:
    # ZB-H1 defers W, so the peak can only grow, and it stays a whole number of microbatches.
    assert without["peak_activation_bytes"] == 4000
    assert kept["peak_activation_bytes"] >= 4000 and kept["peak_activation_bytes"] % 1000 == 0
    code, _, err = run_cli(capsys, "compare", "--weight-memory-fraction", "2")
    assert code == 2 and "weight_memory_fraction must be within 0..1" in err


def test_compare_marks_the_best_rows_and_sorts(capsys) -> None:
    """GPipe and 1F1B share the makespan (m + p - 1)(F + B) but 1F1B holds p microbatches where
    GPipe holds m: both are best by makespan, only 1F1B by memory; --sort memory puts it first."""
    _, out, _ = run_cli(capsys, "compare", "--schedules", "gpipe,1f1b")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[3:5]}
    assert out.splitlines()[2].split()[-1] == "best"
    assert rows["gpipe"][-1] == "makespan" and rows["1f1b"][-1] == "makespan+memory"
    _, out, _ = run_cli(capsys, "compare", "--json", "--schedules", "gpipe,1f1b", "--sort", "memory")
    assert [r["schedule"] for r in json.loads(out)] == ["1f1b", "gpipe"]
    _, out, _ = run_cli(capsys, "compare", "--json", "--sort", "makespan")
    makespans = [r["makespan"] for r in json.loads(out)]
    assert makespans == sorted(makespans) and makespans[0] == pytest.approx(25.5)  # zbv, the README table's best


def test_compare_skips_what_a_calibration_cannot_cut(capsys, tmp_path) -> None:
    """A calibration of an 8-layer model cannot make 2 x 8 = 16 stages: interleaved and
    looped-bfs at v = 8 are skipped with the reason, as sim sweep does, and the rest print."""
    from test_calibrate import write_run  # a synthetic run directory (tests/test_calibrate.py)

    from sim.calibration import calibrate
    from sim.measured import read_measured

    write_run(tmp_path / "run", "1f1b", 8, profile=True)
    costs = tmp_path / "calibration.json"
    calibrate(read_measured(tmp_path / "run")).to_json(costs)
    code, out, err = run_cli(capsys, "compare", "--json", "--costs", str(costs), "--ranks", "2", "--microbatches", "4",
                             "--chunks", "8")
    assert code == 0
    names = [r["schedule"] for r in json.loads(out)]
    assert "interleaved" not in names and "looped-bfs" not in names and "1f1b" in names
    assert "skipping interleaved (p=2, m=4, v=8): the model has 8 layers, fewer than the program's 16 stages" in err
    code, _, err = run_cli(capsys, "compare", "--costs", str(costs), "--schedules", "interleaved", "--ranks", "2",
                           "--microbatches", "4", "--chunks", "8")
    assert code == 2 and "no schedule can run at these sizes" in err
