"""Ranks sharing processors (CostModel.cores): hand-computed timelines and bounds.

Processor sharing: while k compute actions run, each advances at min(1, cores / k) of its speed;
a rank waiting in a RECV takes no processor.
"""

from __future__ import annotations

import random

import pytest

import schedules
from sim import CostError, CostModel, simulate


def rows(result) -> dict[str, tuple[float, float]]:
    t = result.timeline
    return {a: (s, e) for a, s, e in zip(t["action"], t["start"], t["end"])}


def test_gpipe_two_ranks_one_core_by_hand() -> None:
    """F = 1, B = 2 s. Rank 0's F1 and rank 1's F0 share the core from t = 1 (both end at 3);
    rank 0's B0 and rank 1's B1 share it from 6 (both end at 10); alone otherwise: 12 s, not 9."""
    model = CostModel(forward=1.0, backward_full=2.0, cores=1)
    result = simulate(schedules.build("gpipe", ranks=2, microbatches=2), model)
    got = rows(result)
    assert got["0F1"] == (1.0, 3.0) and got["1F0"] == (1.0, 3.0)
    assert got["1F1"] == (3.0, 4.0) and got["1B0"] == (4.0, 6.0)
    assert got["0B0"] == (6.0, 10.0) and got["1B1"] == (6.0, 10.0)
    assert got["0B1"] == (10.0, 12.0)
    assert result.makespan == 12.0


def test_1f1b_two_ranks_one_core_by_hand() -> None:
    """A job that starts while another runs slows it from then on: rank 0's B0 (2 s of work)
    runs at half speed beside rank 1's F1 (5..7) and B1 (7..9), ends at 9; rank 1's B1 has 1 s
    left then and ends at 10."""
    model = CostModel(forward=1.0, backward_full=2.0, cores=1)
    got = rows(simulate(schedules.build("1f1b", ranks=2, microbatches=2), model))
    assert got["1B0"] == (3.0, 5.0)
    assert got["0B0"] == (5.0, 9.0) and got["1F1"] == (5.0, 7.0) and got["1B1"] == (7.0, 10.0)
    assert got["0B1"] == (10.0, 12.0)


@pytest.mark.parametrize("seed", range(12))
def test_enough_cores_change_nothing_and_fewer_obey_the_bounds(seed: int) -> None:
    rng = random.Random(seed)
    name = rng.choice(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv"])
    p = rng.choice([2, 4]) if name != "interleaved" else 2
    m = rng.choice([p, 2 * p, 3 * p])
    schedule = schedules.build(name, ranks=p, microbatches=m, chunks=2 if name == "interleaved" else None)
    base = dict(forward=rng.uniform(0.5, 2), backward_input=rng.uniform(0.5, 2), backward_weight=rng.uniform(0.1, 1),
                p2p_latency=rng.choice([0.0, 0.05]))
    alone = simulate(schedule, CostModel(**base))
    assert simulate(schedule, CostModel(**base, cores=p)).makespan == alone.makespan
    for cores in range(1, p):
        shared = simulate(schedule, CostModel(**base, cores=cores))
        total = sum(e - s for s, e, k in zip(alone.timeline["start"], alone.timeline["end"], alone.timeline["kind"])
                    if k in ("F", "B", "I", "W"))
        # never faster than alone, never faster than the work spread over the cores, never
        # slower than every action run one after another
        assert shared.makespan >= alone.makespan - 1e-9
        assert shared.makespan >= total / cores - 1e-6
        assert shared.makespan <= alone.makespan + total + 1e-6
        assert shared.peak_activation_bytes == alone.peak_activation_bytes


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_cores_must_be_a_positive_integer(bad) -> None:
    with pytest.raises(CostError, match="cores must be a positive integer"):
        CostModel(forward=1.0, backward_full=2.0, cores=bad)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "gpipe"])
def test_idle_ranks_taking_a_full_share_slow_every_action_alike(name: str) -> None:
    """With idle_share 1 every rank takes a share of the cores whether it computes or not, so
    4 ranks on 2 cores each run at 2 / 4 of their speed at every moment: the timeline is the one
    on processors of their own with every compute cost doubled."""
    shared = CostModel(forward=1.0, backward_full=2.0, backward_input=1.0, backward_weight=1.0, cores=2,
                       idle_share=1.0)
    doubled = CostModel(forward=2.0, backward_full=4.0, backward_input=2.0, backward_weight=2.0)
    schedule = schedules.build(name, ranks=4, microbatches=8)
    assert rows(simulate(schedule, shared)) == rows(simulate(schedule, doubled))


def test_idle_share_by_hand() -> None:
    """GPipe, 2 ranks on 1 core, F = 1 s, idle share 0.5: an action alone runs at 1 / 1.5 of
    its speed, two together at 1 / 2 each. Rank 0's F0 alone: 0..1.5; its F1 beside rank 1's F0
    from 1.5: both end at 3.5; rank 1's F1 alone: 3.5..5 (idle share 0: 1, 3 and 4)."""
    idle = CostModel(forward=1.0, backward_full=2.0, cores=1, idle_share=0.5)
    got = rows(simulate(schedules.build("gpipe", ranks=2, microbatches=2), idle))
    assert got["0F0"] == (0.0, 1.5)
    assert got["0F1"] == (1.5, 3.5) and got["1F0"] == (1.5, 3.5)
    assert got["1F1"] == (3.5, 5.0)


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "half"])
def test_idle_share_out_of_range_is_refused(bad) -> None:
    with pytest.raises(CostError, match="idle_share"):
        CostModel(forward=1.0, backward_full=2.0, cores=2, idle_share=bad)
