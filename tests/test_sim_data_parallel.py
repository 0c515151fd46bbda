"""The simulator's gradient reductions (REDUCE_GRAD) against hand-computed step times."""

import math

import pytest

import schedules
from sim.costs import CostModel, CostError
from sim.engine import simulate


def _costs(d: int, latency: float, num_bytes, bandwidth: float = 1e9) -> CostModel:
    return CostModel(forward=1.0, backward_full=2.0, data_parallel=d, grad_reduce_bytes=num_bytes,
                     allreduce_latency=latency, allreduce_bandwidth=bandwidth)


@pytest.mark.parametrize("d, reduce_seconds", [(2, 0.5 + 1.0), (4, 0.5 + 1.5), (8, 0.5 + 1.75)])
def test_ring_all_reduce_after_the_last_backward(d, reduce_seconds):
    """1F1B, p=2, m=4, F=1, B=2: rank 0's last B ends at (m+p-1)(F+B) = 15 s, rank 1's at 13 s.
    A reduction of 1 GB per stage at 1 GB/s takes alpha + 2(d-1)/d s: rank 0's extends the
    step; rank 1's overlaps the drain (it ends before 15 s whenever it takes under 2 s)."""
    schedule = schedules.build("1f1b", ranks=2, microbatches=4)
    result = simulate(schedules.lower(schedule, d), _costs(d, 0.5, [1e9, 1e9]))
    assert result.makespan == pytest.approx(15 + reduce_seconds)
    rows = result.timeline[result.timeline["kind"] == "REDUCE_GRAD"].set_index("rank")
    assert rows.loc[1, "start"] == pytest.approx(13) and rows.loc[1, "end"] == pytest.approx(13 + reduce_seconds)
    assert list(rows["action"]) == ["0REDUCE_GRAD", "1REDUCE_GRAD"] and list(rows["peer"]) == [-1, -1]
    assert result.busy == simulate(schedule, _costs(d, 0.5, [1e9, 1e9])).busy  # reductions are not compute


def test_a_ranks_reductions_take_turns_on_its_collective_resource():
    """looped-bfs on one rank with two stages (F 0.5 s, B 1 s each), m=1: 0F0 1F0 1B0 0B0.
    1REDUCE_GRAD runs 2..12 s (alpha 10 s); 0REDUCE_GRAD, reached at 3 s, waits for it: 12..22."""
    schedule = schedules.build("looped-bfs", ranks=1, microbatches=1, chunks=2)
    result = simulate(schedules.lower(schedule, 2), _costs(2, 10.0, 0))
    rows = result.timeline[result.timeline["kind"] == "REDUCE_GRAD"].set_index("stage")
    assert (rows.loc[1, "start"], rows.loc[1, "end"]) == (2.0, 12.0)
    assert (rows.loc[0, "start"], rows.loc[0, "end"]) == (12.0, 22.0)
    assert result.makespan == 22.0


def test_without_data_parallelism_nothing_changes():
    schedule = schedules.build("zb-h1", ranks=4, microbatches=8)
    costs = _costs(1, 0.5, 1e9)
    assert simulate(schedules.lower(schedule, 1), costs).makespan == simulate(schedule, costs).makespan


def test_cost_model_fields_round_trip_and_are_checked():
    costs = _costs(4, 1e-4, [1.0, 2.0], bandwidth=math.inf)
    assert CostModel.from_dict(costs.to_dict()) == costs
    assert costs.to_dict()["allreduce_bandwidth"] is None
    with pytest.raises(CostError, match="data_parallel must be a positive integer"):
        _costs(0, 0.0, 0)
    with pytest.raises(CostError, match="allreduce_bandwidth must be a number > 0"):
        _costs(2, 0.0, 0, bandwidth=0)
