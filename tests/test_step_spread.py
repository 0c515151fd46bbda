"""The step-time spread the simulator's draws give (sim.result.SimResult.step_time_spread), in
closed form, and beside the measured one in `sim compare --measured` and the quality report.

1F1B at p=2, m=2 with F = 1 ms, B = 2 ms and free transfers has a makespan of (m + p - 1)(F + B)
= 9 ms. With a step overhead of 1 ms drawn at 0.5x or 1.5x (four draws, stratified: each factor
twice) and no other spread, the draws' steps are 9.5, 9.5, 10.5 and 10.5 ms: the result is the
lower median draw (9.5 ms) and the spread (IQR / median, as a measured run's) 1 / 10.
"""

from __future__ import annotations

import dataclasses

import pytest

import schedules
from test_calibrate import true_costs, write_run

from sim import CostModel, simulate
from sim.calibration import calibrate
from sim.comparison import compare_run
from sim.measured import read_measured
from sim.metrics import step_spread
from sim.quality import quality_of

MS = 1e-3


def one_f_one_b(**spread) -> tuple[schedules.Schedule, CostModel]:
    return (schedules.build("1f1b", ranks=2, microbatches=2),
            CostModel(forward=1 * MS, backward_full=2 * MS, step_overhead=1 * MS, **spread))


def test_without_a_spread_there_are_no_draws():
    schedule, costs = one_f_one_b()
    result = simulate(schedule, costs)
    assert result.draw_step_times_ns == () and result.step_time_spread == 0.0
    assert result.step_time == pytest.approx(10 * MS)  # 9 ms makespan + 1 ms overhead
    assert result.summary()["step_time_spread"] == 0.0


def test_the_draws_of_a_step_overhead_spread_in_closed_form():
    schedule, costs = one_f_one_b(step_overhead_spread=(0.5, 1.5), spread_draws=4)
    result = simulate(schedule, costs)
    assert result.draw_step_times_ns == (9_500_000, 9_500_000, 10_500_000, 10_500_000)
    assert result.step_time == pytest.approx(9.5 * MS)  # the lower median draw
    assert result.step_time_spread == pytest.approx(0.1, rel=1e-12)


def test_step_spread_is_the_interquartile_range_over_the_median():
    assert step_spread([]) == 0.0
    assert step_spread([2.0] * 5) == 0.0
    # 1..5: quartiles 2 and 4 (linear), median 3
    assert step_spread([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(2 / 3, rel=1e-12)


def test_compare_and_the_quality_report_set_the_draws_spread_beside_the_measured(tmp_path):
    """A synthetic run's steps are all alike (measured spread 0); simulated under the machine's
    own costs with a step overhead drawn at 0.5x or 1.5x, its draws spread by STEP / (makespan +
    STEP), as in closed form above. Its own calibration holds no spread: no draws, 0."""
    truth = write_run(tmp_path / "run", "1f1b", 8, profile=True)
    run = read_measured(tmp_path / "run")
    machine = true_costs(2)
    drawn = dataclasses.replace(machine, step_overhead_spread=(0.5, 1.5), spread_draws=4)
    comparison, _ = compare_run(run, drawn)
    step = machine.step_overhead
    makespan = truth - step
    assert comparison.step_time_spread == 0.0
    assert comparison.step_time_spread_simulated == pytest.approx(step / (makespan + step), rel=1e-9)
    line = next(x for x in comparison.report("test").splitlines() if x.startswith("step-time spread"))
    assert line.split()[2:4] == ["0.0%", f"{100 * step / (makespan + step):.1f}%"]
    entry = quality_of(calibrate(run), [run])["runs"][0]
    assert entry["step_time_spread"] == 0.0 and entry["step_time_spread_simulated"] == 0.0
