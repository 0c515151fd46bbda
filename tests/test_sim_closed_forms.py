"""Closed forms the simulator must reproduce exactly (uniform stages, zero communication).

Sources: GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021): bubble (p-1)/(m+p-1) of
the p x makespan box; interleaved 1F1B (Narayanan et al. SC'21): (p-1)/(v m + p-1) when p | m,
i.e. Megatron's fraction (p-1)/(v m); zero-bubble paper (Qi et al. 2024) Sec. 2: 1F1B's bubble
per rank (p-1)(T_F + T_B + T_W) with B split into input part T_B and weight part T_W.
Peak activation (rank-share microbatch units): GPipe m; 1F1B min(p-r, m) on rank r;
interleaved rank 0 min(p v + p - 1, m v) / v, i.e. (p v + p - 1)/v once m >= 2p.
"""

from __future__ import annotations

import itertools

import pytest

import schedules
from sim import CostModel, simulate

REL = 1e-9
TIMES = [(1.0, 2.0, 0.0), (0.37, 1.13, 0.0), (2.5, 0.5, 0.25), (0.001, 0.003, 0.002), (3.0, 3.0, 3.0)]


def costs(f: float, b: float, w: float = 0.0) -> CostModel:
    return CostModel(forward=f, backward_input=b, backward_weight=w)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", list(itertools.product([1, 2, 3, 4, 8], [1, 2, 3, 5, 8, 16])))
def test_gpipe_and_1f1b_bubble_ratio(name: str, p: int, m: int) -> None:
    for f, b, w in TIMES:
        result = simulate(schedules.build(name, ranks=p, microbatches=m), costs(f, b, w))
        assert result.bubble_ratio == pytest.approx((p - 1) / (m + p - 1), rel=REL, abs=1e-15)
        assert result.makespan == pytest.approx((m + p - 1) * (f + b + w), rel=REL)
        assert result.bubble_fraction == pytest.approx((p - 1) / m, rel=REL, abs=1e-15)


@pytest.mark.parametrize("p,v,k", list(itertools.product([2, 3, 4], [2, 3, 4], [1, 2, 3])))
def test_interleaved_bubble_ratio(p: int, v: int, k: int) -> None:
    m = k * p
    schedule = schedules.build("interleaved", ranks=p, microbatches=m, chunks=v)
    for f, b, w in TIMES:
        result = simulate(schedule, costs(f, b, w))
        assert result.bubble_ratio == pytest.approx((p - 1) / (v * m + p - 1), rel=REL)
        assert result.bubble_fraction == pytest.approx((p - 1) / (v * m), rel=REL)
        assert result.makespan == pytest.approx((v * m + p - 1) * (f + b + w) / v, rel=REL)


@pytest.mark.parametrize("p,m", list(itertools.product([1, 2, 4, 5], [1, 3, 4, 8])))
def test_peak_activation_gpipe_and_1f1b(p: int, m: int) -> None:
    gpipe = simulate(schedules.build("gpipe", ranks=p, microbatches=m), costs(1.0, 2.0))
    assert gpipe.peak_activation == [m] * p
    one = simulate(schedules.build("1f1b", ranks=p, microbatches=m), CostModel(1.0, 2.0, activation_memory=3000))
    assert one.peak_activation == [min(p - r, m) for r in range(p)]
    assert one.peak_activation_bytes == [3000 * min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("p,v,k", list(itertools.product([2, 3, 4], [2, 3, 4], [1, 2, 3])))
def test_peak_activation_interleaved_rank0(p: int, v: int, k: int) -> None:
    m = k * p
    result = simulate(schedules.build("interleaved", ranks=p, microbatches=m, chunks=v), costs(1.0, 2.0))
    expected = min(p * v + p - 1, m * v) / v
    assert result.peak_activation[0] == pytest.approx(expected, rel=REL)
    if m >= 2 * p:
        assert result.peak_activation[0] == pytest.approx((p * v + p - 1) / v, rel=REL)


@pytest.mark.parametrize("p,v,k", list(itertools.product([2, 3, 4], [2, 3, 4], [1, 2, 3])))
def test_peak_activation_interleaved_every_rank(p: int, v: int, k: int) -> None:
    """Megatron-LM's interleaved schedule (schedules.py, forward_backward_pipelining_with_interleaving)
    runs (p - r - 1) * 2 + (v - 1) * p warm-up forwards of a chunk on rank r, then holds one
    more before its first backward: min(that + 1, m v) chunk activations, 1/v of a rank share each."""
    m = k * p
    result = simulate(schedules.build("interleaved", ranks=p, microbatches=m, chunks=v), costs(1.0, 2.0))
    expected = [min((p - r - 1) * 2 + (v - 1) * p + 1, m * v) / v for r in range(p)]
    assert result.peak_activation == pytest.approx(expected, rel=REL)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 8)])
def test_1f1b_split_costs_bubble_per_rank(p: int, m: int) -> None:
    """1F1B with B = I + W: every rank idles (p-1)(T_F+T_B+T_W) of the makespan, and
    within its own span rank r idles (p-1-r)(T_F+T_B+T_W). Rank 0's span is the whole
    makespan, so the paper's bubble rate (longest span) is (p-1)/(m+p-1), 1F1B's bubble ratio."""
    tf, tb, tw = 1.0, 1.5, 0.75
    result = simulate(schedules.build("1f1b", ranks=p, microbatches=m), costs(tf, tb, tw))
    unit = tf + tb + tw
    for rank in range(p):
        assert result.idle[rank] == pytest.approx((p - 1) * unit, rel=REL)
        assert result.span_idle[rank] == pytest.approx((p - 1 - rank) * unit, rel=REL, abs=1e-12)
    assert result.bubble_ratio_rank_span == pytest.approx((p - 1) / (m + p - 1), rel=REL)
    assert result.bubble_ratio_rank_span == pytest.approx(result.bubble_ratio, rel=REL)
    assert result.rank_span_bubbles == pytest.approx([(p - 1 - r) / (m + p - 1 - r) for r in range(p)], rel=REL)


def test_only_full_backward_splits_evenly_for_split_schedules() -> None:
    """backward_full alone: B costs B, and a split backward runs I = W = B/2 (p=1, hand order)."""
    order = ((schedules.Action.parse("0F0"), schedules.Action.parse("0I0"), schedules.Action.parse("0W0")),)
    schedule = schedules.Schedule("hand", 1, 1, 1, (0,), order)
    result = simulate(schedule, CostModel(forward=1.0, backward_full=3.0))
    assert list(result.timeline["end"] - result.timeline["start"]) == [1.0, 1.5, 1.5]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 8)])
def test_bubble_of_a_timeline_in_seconds_shorter_than_a_second(name: str, p: int, m: int) -> None:
    """Measured timelines are in seconds (the simulator counts integer nanoseconds): step_metrics
    of a step far shorter than a second, p x makespan < 1, must still give (p-1)/(m+p-1)."""
    from schedules.timeline import step_metrics

    f, b = 0.001, 0.003
    timeline = simulate(schedules.build(name, ranks=p, microbatches=m), costs(f, b)).timeline
    (row,) = step_metrics(timeline, ranks=p).to_dict("records")
    assert row["makespan"] == pytest.approx((m + p - 1) * (f + b), rel=REL)
    assert p * row["makespan"] < 1
    assert row["bubble_ratio"] == pytest.approx((p - 1) / (m + p - 1), rel=REL)


from hypothesis import assume, given, settings, strategies as st  # noqa: E402


# A chunk's share of a rank's cost (F / v) is rounded to whole nanoseconds by the simulator.
NS_REL = 1e-7


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(schedules.available()), st.integers(1, 6), st.integers(1, 16), st.integers(1, 3),
       st.integers(1, 5), st.integers(1, 5), st.integers(0, 3))
def test_random_legal_parameters_obey_the_bounds(name, p, m, v, f, b, w):
    """Any legal (schedule, p, m, v) under integer costs (exact): every rank computes m(F+I+W);
    the makespan is at least that and at least one microbatch's critical path, p(F+I) (its F
    and I pass every stage; per stage a rank's share over its chunks); the bubble is exactly
    the idle share of the box; the closed forms hold where they exist; and the simulator is
    deterministic."""
    try:
        schedule = schedules.build(name, ranks=p, microbatches=m, chunks=v)
    except schedules.ScheduleError:
        assume(False)
    fused = not any(a.kind.value in ("I", "W") for row in schedule.order for a in row)
    model = costs(f, b, w)
    result = simulate(schedule, model)
    work = m * (f + b + w)
    assert result.busy == pytest.approx([work] * p, rel=NS_REL)
    assert result.makespan >= max(work, p * (f + b)) * (1 - NS_REL)
    assert 0 <= result.bubble_ratio < 1
    assert result.bubble_ratio == pytest.approx(1 - work / result.makespan, rel=NS_REL, abs=NS_REL)
    if name in ("gpipe", "1f1b"):
        assert result.makespan == pytest.approx((m + p - 1) * (f + b + w), rel=NS_REL)
        assert result.peak_activation == ([m] * p if name == "gpipe" else [min(p - r, m) for r in range(p)])
    if name == "interleaved" and fused:
        v = schedule.chunks
        assert result.makespan == pytest.approx((v * m + p - 1) * (f + b + w) / v, rel=NS_REL)
        assert result.peak_activation[0] == pytest.approx(min(p * v + p - 1, m * v) / v, rel=NS_REL)
    again = simulate(schedule, model)
    assert (again.makespan, again.busy, again.peak_activation) == (result.makespan, result.busy, result.peak_activation)


@pytest.mark.parametrize("m", [1, 2, 4, 7])
def test_place_factors_charge_a_stages_first_actions_in_a_step(m: int) -> None:
    """One rank, GPipe: F of microbatch 0 costs 2F, B of microbatches 0 and 1 cost 0.5B and
    1.5B (the first backward assigns the gradients later ones add to), the rest F and B."""
    f, b = 1.0, 2.0
    model = CostModel(forward=f, backward_full=b, place_factors={"F": [2.0], "B": [0.5, 1.5]})
    expected = (2 * f + (m - 1) * f) + (0.5 * b + (1.5 * b if m > 1 else 0) + max(m - 2, 0) * b)
    assert simulate(schedules.build("gpipe", ranks=1, microbatches=m), model).makespan == pytest.approx(expected, rel=REL)
