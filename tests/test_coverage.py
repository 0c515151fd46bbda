"""What a program holds beyond a calibration's runs (sim.coverage), in closed form, and how a
calibration records its runs and the CLI says what a prediction lies beyond.

Coverage is read from the streams alone: 1F1B at p=2 runs two forwards in a row on rank 0
(its warm-up) and two backwards (its cool-down), GPipe runs m of each, interleaved switches
between a rank's two stages. Synthetic runs come from tests/test_calibrate.py's `write_run`
(a 1F1B run at p=2, m=8 of an 8-layer model: two stages of 4 layers).
"""

from __future__ import annotations

import json

import pytest

import schedules
from test_calibrate import run_cli, write_run

from sim.calibration import Calibration, calibrate
from schedules.analysis import longest_repeats, switches_stage
from sim.coverage import Coverage, Topic, beyond, coverage_of
from sim.measured import read_measured


def program(name: str, ranks: int = 2, microbatches: int = 4, chunks: int | None = None) -> schedules.Program:
    return schedules.lower(schedules.build(name, ranks=ranks, microbatches=microbatches, chunks=chunks))


def test_longest_repeats_in_closed_form():
    # 1F1B, p=2: rank 0 runs min(p, m) = 2 forwards before its first backward, and ends on two backwards
    assert longest_repeats(program("1f1b", microbatches=4)) == {"F": 2, "B": 2}
    assert longest_repeats(program("1f1b", ranks=4, microbatches=8)) == {"F": 4, "B": 4}
    for m in (1, 3, 8):  # GPipe: m forwards, then m backwards
        assert longest_repeats(program("gpipe", microbatches=m)) == {"F": m, "B": m}
    assert switches_stage(program("interleaved", chunks=2)) and not switches_stage(program("1f1b"))


def test_coverage_of_several_runs_takes_the_union():
    held = coverage_of([program("1f1b"), program("gpipe", microbatches=6), program("interleaved", chunks=2)],
                       [[4, 4], [4, 4], [2, 2, 2, 2]])
    assert held == Coverage((2,), (2, 4), {"F": 6, "B": 6}, True)
    assert Coverage.from_dict(json.loads(json.dumps(held.to_dict()))) == held


def topics(notes) -> list[Topic]:
    return [note.topic for note in notes]


def test_each_topic_is_noted_where_and_only_where_the_program_holds_more():
    one_f_one_b = coverage_of([program("1f1b")], [[4, 4]])
    # GPipe at m=8: runs of 8, the runs 2 at most: the discount was never told
    notes = beyond(one_f_one_b, program("gpipe", microbatches=8), [4, 4])
    assert topics(notes) == [Topic.REPEATS_UNTOLD]
    assert "up to 8 B, 8 F in a row" in notes[0].text and "at most 2 B, 2 F" in notes[0].text
    # runs of 3 or more tell it; longer runs still are carried by the law
    with_gpipe = coverage_of([program("1f1b"), program("gpipe", microbatches=4)], [[4, 4], [4, 4]])
    assert topics(beyond(with_gpipe, program("gpipe", microbatches=16), [4, 4])) == [Topic.REPEATS_CARRIED]
    assert beyond(with_gpipe, program("gpipe", microbatches=4), [4, 4]) == []
    # interleaved: switches between stages and stages of 2 layers, neither of which 1F1B held
    assert topics(beyond(one_f_one_b, program("interleaved", chunks=2), [2, 2, 2, 2])) == [
        Topic.STAGE_SWITCHES, Topic.STAGE_SIZES]
    # four ranks (and 1F1B's runs of 4 there)
    assert topics(beyond(one_f_one_b, program("1f1b", ranks=4, microbatches=8), [2, 2, 2, 2])) == [
        Topic.REPEATS_UNTOLD, Topic.RANKS, Topic.STAGE_SIZES]
    # 1F1B at another m holds nothing new
    assert beyond(one_f_one_b, program("1f1b", microbatches=16), [4, 4]) == []


@pytest.mark.parametrize("name", sorted(set(schedules.available())))
@pytest.mark.parametrize("ranks,microbatches", [(2, 2), (2, 8), (4, 8)])
def test_a_program_never_lies_beyond_its_own_runs(name, ranks, microbatches):
    try:
        own = program(name, ranks, microbatches)
    except schedules.ScheduleError:
        pytest.skip(f"{name} does not run at p={ranks}, m={microbatches}")
    layers = [1] * own.schedule.num_stages
    assert beyond(coverage_of([own], [layers]), own, layers) == []


def test_a_coverage_that_records_no_run_notes_nothing():
    assert beyond(Coverage(), program("gpipe", microbatches=8), [4, 4]) == []


@pytest.fixture(scope="module")
def calibration_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("coverage")
    write_run(root / "1f1b-m8", "1f1b", 8, profile=True)
    path = root / "costs.json"
    calibrate(read_measured(root / "1f1b-m8")).to_json(path)
    return path


def test_a_calibration_records_what_its_runs_held_and_older_files_note_nothing(calibration_file):
    calibration = Calibration.from_dict(json.loads(calibration_file.read_text()))
    assert calibration.coverage == {"ranks": [2], "stage_layers": [4], "longest_repeats": {"F": 2, "B": 2},
                                    "stage_switches": False}
    assert "the runs held: p = 2; stages of 4 layers; longest runs of repeats B 2, F 2; one stage per rank" \
        in calibration.report()
    assert topics(calibration.beyond(program("gpipe", microbatches=8))) == [Topic.REPEATS_UNTOLD]
    older = {k: v for k, v in json.loads(calibration_file.read_text()).items() if k != "coverage"}
    assert Calibration.from_dict(older).beyond(program("gpipe", microbatches=8)) == []


def test_compare_and_sweep_say_what_a_prediction_lies_beyond(calibration_file, tmp_path, capsys):
    code, out, err = run_cli(capsys, "compare", "--costs", calibration_file, "--schedules", "1f1b,gpipe,interleaved",
                             "--ranks", "2", "--microbatches", "4", "--json")
    assert code == 0, err
    notes = {r["schedule"]: [n["topic"] for n in r["beyond_calibration"]] for r in json.loads(out)}
    assert notes == {"1f1b": [], "gpipe": ["repeats, discount not told"],
                     "interleaved": ["stage switches", "stage sizes"]}
    assert "sim compare: beyond the calibration's runs (stage switches) for 1 configuration(s)" in err
    write_run(tmp_path / "held-out", "interleaved", 4, chunks=2)
    code, out, err = run_cli(capsys, "compare", "--measured", tmp_path / "held-out", "--costs", calibration_file)
    assert code == 0, err
    assert "beyond the calibration's runs (stage switches): it switches between stages on a rank" in out
    assert "beyond the calibration's runs (stage sizes): it has stages of 2 layers, the calibration's runs of 4" in out
    code, out, err = run_cli(capsys, "compare", "--measured", tmp_path / "held-out")
    assert code == 0 and "beyond the calibration" not in out  # a replay of the run itself
    code, _, err = run_cli(capsys, "sweep", "--costs", calibration_file, "--schedules", "gpipe", "--ranks", "2,4",
                           "--microbatches", "2,4", "--out", tmp_path / "sweep.csv", "--no-progress")
    assert code == 0, err
    # runs of m: at m=4 (p=2 and 4) beyond the 1F1B run's 2; four ranks cut the model into stages of 2 layers
    assert "sim sweep: beyond the calibration's runs (repeats, discount not told) for 2 configuration(s)" in err
    assert "sim sweep: beyond the calibration's runs (ranks) for 2 configuration(s)" in err
    assert "sim sweep: beyond the calibration's runs (stage sizes) for 2 configuration(s)" in err


def test_the_bench_splits_the_standing_by_note(tmp_path, capsys):
    """bench/coverage_errors.py on a standing of four p=2 cases with known errors: GPipe m=8
    (runs of 8: noted from both calibrations), 1F1B m=8 (noted from neither), interleaved m=2
    (stage switches: noted from 1F1B alone, not from the three runs, which hold an interleaved
    one) and ZB-H2 m=8 (runs of 3 F and 3 W: noted from both)."""
    from pathlib import Path

    from scripts import load_script

    bench = load_script(Path(__file__).resolve().parents[1] / "bench" / "coverage_errors.py")
    standing = tmp_path / "standing.csv"
    standing.write_text("group,p,schedule,m,err_1f1b,err_three\n"
                        "g,2,gpipe,8,0.10,0.20\n"
                        "g,2,1f1b,8,-0.01,0.02\n"
                        "g,2,interleaved,2,-0.07,0.03\n"
                        "g,2,zb-h2,8,0.05,-0.04\n")
    assert bench.main([str(standing)]) == 0
    out = capsys.readouterr().out
    assert "| 1f1b | no | 1 | 1.0% | 1/1 | -1.0% (g 1f1b m=8) |" in out
    assert "| 1f1b | yes | 3 | 7.3% | 1/3 | +10.0% (g gpipe m=8) |" in out  # (10 + 7 + 5) / 3
    assert "| three | no | 2 | 2.5% | 2/2 | +3.0% (g interleaved m=2) |" in out
    assert "| three | yes | 2 | 12.0% | 1/2 | +20.0% (g gpipe m=8) |" in out
    assert "| 1f1b | stage switches | 1 | 7.0% | -7.0% |" in out
    assert bench.main([str(tmp_path / "missing.csv")]) == 2
