"""Planning with a calibration as the cost source: on a synthetic machine (tests/test_calibrate.py) the
plan's step times equal the machine's true step times for schedules the calibration run never ran."""

import dataclasses

import pytest

from sim.calibration import calibrate
from sim.__main__ import main
from sim.measured import read_measured
from sim.planner import PlanError, Space, plan
from sim.planner.calibrated import calibrated_request
from test_calibrate import ROWS, write_run

GPT = {"model": "gpt", "layers": 8, "hidden": 64, "heads": 4, "seq_len": 16, "vocab": 32, "seed": 0}


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "1f1b-m8"
    write_run(path, "1f1b", 8, profile=True)
    # The synthetic machine's model is an mlp; the planner plans transformers, so name it a gpt of 8 layers.
    return dataclasses.replace(calibrate(read_measured(path)), model=GPT)


def test_plan_steps_equal_the_machines(calibration, tmp_path):
    space = Space(schedules=("gpipe", "1f1b", "interleaved"), chunks=(2,))
    result = plan(calibrated_request(calibration, 2, ROWS * 8, space, top=3))
    assert {e.config.schedule for e in result.ranked} == {"gpipe", "1f1b", "interleaved"}
    for ev in result.ranked:
        c = ev.config
        true = write_run(tmp_path / f"{c.schedule}", c.schedule, 8, chunks=c.chunks if c.schedule == "interleaved" else None)
        assert ev.step_time == pytest.approx(true, abs=2e-9)
        assert (c.tp, c.dp, c.pp, c.microbatch_size) == (1, 1, 2, ROWS)


def test_calibrated_request_errors(calibration, tmp_path, capsys):
    with pytest.raises(PlanError, match=f"holds {ROWS} sequences"):
        calibrated_request(calibration, 2, ROWS * 8 + 1, Space())
    path = tmp_path / "costs.json"
    path.write_text('{"forward": 1.0, "backward_full": 2.0}')
    assert main(["plan", "--costs", str(path), "--gpus", "2", "--global-batch", "8"]) == 2
    assert "is a cost model, not a calibration" in capsys.readouterr().err
