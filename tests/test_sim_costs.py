"""The cost model: scalar vs per-stage values, backward defaults, transfers, memory, JSON."""

from __future__ import annotations

import json
import math

import pytest

import schedules
from sim import CostError, CostModel

LOOPED_2x2 = schedules.build("interleaved", ranks=2, microbatches=2, chunks=2)  # 4 stages, v=2
ONE_F_ONE_B = schedules.build("1f1b", ranks=3, microbatches=3)  # 3 stages, v=1


def test_scalar_is_a_rank_share_split_over_chunks() -> None:
    c = CostModel(forward=1.0, backward_input=3.0, backward_weight=1.0, activation_memory=1000).for_schedule(LOOPED_2x2)
    assert c.forward == (500_000_000,) * 4
    assert c.input == (1_500_000_000,) * 4 and c.weight == (500_000_000,) * 4
    assert c.backward == (2_000_000_000,) * 4
    assert c.memory == (500,) * 4
    v1 = CostModel(forward=1.0, backward_input=3.0).for_schedule(ONE_F_ONE_B)
    assert v1.forward == (1_000_000_000,) * 3 and v1.weight == (0,) * 3 and v1.backward == (3_000_000_000,) * 3


def test_lists_are_per_stage_as_given() -> None:
    c = CostModel(forward=[1.0, 2.0, 3.0, 4.0], backward_input=[0.5, 0.5, 0.5, 5.0]).for_schedule(LOOPED_2x2)
    assert c.forward == (1_000_000_000, 2_000_000_000, 3_000_000_000, 4_000_000_000)
    assert c.backward == (500_000_000,) * 3 + (5_000_000_000,)


@pytest.mark.parametrize(
    "kwargs,expected",  # expected (B, I, W) in seconds for v=1
    [
        ({"backward_input": 2.0}, (2.0, 2.0, 0.0)),
        ({"backward_input": 2.0, "backward_weight": 1.0}, (3.0, 2.0, 1.0)),
        ({"backward_full": 3.0}, (3.0, 1.5, 1.5)),
        ({"backward_full": 3.0, "backward_input": 2.0}, (3.0, 2.0, 1.0)),
        ({"backward_full": 3.0, "backward_weight": 0.5}, (3.0, 2.5, 0.5)),
        ({"backward_full": 2.5, "backward_input": 2.0, "backward_weight": 1.0}, (2.5, 2.0, 1.0)),
    ],
)
def test_backward_defaults(kwargs, expected) -> None:
    c = CostModel(forward=1.0, **kwargs).for_schedule(ONE_F_ONE_B)
    b, i, w = (round(x * 1e9) for x in expected)
    assert (c.backward[0], c.input[0], c.weight[0]) == (b, i, w)


def test_odd_backward_split_stays_exact() -> None:
    c = CostModel(forward=1.0, backward_full=3e-9).for_schedule(ONE_F_ONE_B)
    assert (c.backward[0], c.input[0], c.weight[0]) == (3, 1, 2)


def test_transfers_and_memory() -> None:
    model = CostModel(
        forward=1.0, backward_input=1.0, p2p_latency=1e-6, p2p_bandwidth=1e9,
        p2p_activation_bytes=[1000, 2000, 3000], activation_memory=[10, 20, 30, 40],
        weight_memory_fraction=0.5, static_memory=7,
    )
    c = model.for_schedule(LOOPED_2x2)
    assert c.send_forward == (2000, 3000, 4000) and c.send_backward == c.send_forward
    assert c.weight_memory == (5, 10, 15, 20) and c.static == (7, 7)
    grads = CostModel(forward=1.0, backward_input=1.0, p2p_activation_bytes=10, p2p_gradient_bytes=20, p2p_bandwidth=10.0)
    g = grads.for_schedule(LOOPED_2x2)
    assert g.send_forward == (1_000_000_000,) * 3 and g.send_backward == (2_000_000_000,) * 3
    assert CostModel(1.0, 1.0).for_schedule(LOOPED_2x2).send_forward == (0, 0, 0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"forward": -1.0, "backward_input": 1.0}, "forward must be a finite number >= 0"),
        ({"forward": 1.0}, "give backward_input"),
        ({"forward": "1", "backward_input": 1.0}, "forward must be a number"),
        ({"forward": [1.0, math.nan], "backward_input": 1.0}, r"forward\[1\]"),
        ({"forward": 1.0, "backward_input": 1.0, "p2p_bandwidth": 0}, "p2p_bandwidth must be a number > 0"),
        ({"forward": 1.0, "backward_input": 1.0, "weight_memory_fraction": 1.5}, "within 0..1"),
        ({"forward": 1.0, "backward_input": 1.0, "link_contention": "yes"}, "true or false"),
        ({"forward": 1.0, "backward_input": 1.0, "repeat_discount_forward": 1.0}, "up to .not including. 1"),
        ({"forward": 1.0, "backward_input": 1.0, "repeat_discount_backward": -0.1}, "repeat_discount_backward"),
        ({"forward": 1.0, "backward_input": 1.0, "compute_growth": True}, "compute_growth must be a finite number"),
        ({"forward": 1.0, "backward_input": 1.0, "compute_growth": math.inf}, "compute_growth must be a finite number"),
        ({"forward": 1.0, "backward_input": 1.0, "growth_horizon": -1.0}, "growth_horizon must be a finite number"),
        ({"forward": 1.0, "backward_input": 1.0, "compute_growth": -2.0, "growth_horizon": 0.5},
         "1 \\+ compute_growth x growth_horizon must be > 0"),
    ],
)
def test_malformed_models(kwargs, message) -> None:
    with pytest.raises(CostError, match=message):
        CostModel(**kwargs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"forward": [1.0] * 3}, "forward lists 3 values, but the schedule has 4 stages"),
        ({"forward": 1.0, "p2p_activation_bytes": [1, 2]}, "2 values, but the schedule has 3 stage boundaries"),
        ({"forward": 1.0, "static_memory": [1, 2, 3]}, "3 values, but the schedule has 2 ranks"),
        ({"forward": 1.0, "backward_full": 1.0, "backward_weight": 2.0}, "backward_weight of stage 0 exceeds"),
        ({"forward": 1.0, "activation_memory": 10, "input_memory": 20}, "input_memory .* within its activation"),
        ({"forward": 1.0, "output_memory": [5] * 4, "output_weight_memory": [6] * 4}, "output_weight_memory .6. within"),
    ],
)
def test_models_that_do_not_fit_the_schedule(kwargs, message) -> None:
    kwargs = {"backward_input": 1.0, **kwargs} if "backward_full" not in kwargs else kwargs
    with pytest.raises(CostError, match=message):
        CostModel(**kwargs).for_schedule(LOOPED_2x2)


def test_json_round_trip(tmp_path) -> None:
    model = CostModel(
        forward=[1.0, 2.0, 3.0], backward_input=2.0, backward_weight=[0.5, 0.5, 1.0], p2p_latency=1e-5,
        p2p_bandwidth=1e10, p2p_activation_bytes=[10, 20], activation_memory=[1, 2, 3], weight_memory=1,
        static_memory=[5, 6, 7], link_contention=False,
    )
    path = tmp_path / "costs.json"
    model.to_json(path)
    assert CostModel.from_json(path) == model
    assert CostModel.from_dict(model.to_dict()) == model
    default = CostModel(1.0, 2.0)
    data = json.loads(json.dumps(default.to_dict()))  # strict JSON: infinite bandwidth is null
    assert data["p2p_bandwidth"] is None
    assert CostModel.from_dict(data) == default
    assert CostModel.from_dict({"forward": 1.0, "backward_full": 2.0}) == CostModel(1.0, backward_full=2.0)


def test_bad_json(tmp_path) -> None:
    with pytest.raises(CostError, match="cannot read cost model"):
        CostModel.from_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CostError, match="not valid JSON"):
        CostModel.from_json(bad)
    bad.write_text('{"forward": 1, "backward_input": 1, "fowrard": 2}')
    with pytest.raises(CostError, match="unknown cost model key"):
        CostModel.from_json(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(CostError, match="JSON object"):
        CostModel.from_json(bad)


def test_compute_scaled_scales_every_compute_cost_and_nothing_else() -> None:
    """GPipe with F = 1, B = 2 and no transfers takes (m + p - 1)(F + B) (closed form); at
    1.5x the compute it takes 1.5x that, and the program's compute (summed over ranks) is
    m p (F + B) x 1.5. Transfer, overhead and memory fields stay as they were."""
    from sim.engine import compute_seconds

    base = CostModel(forward=1.0, backward_full=2.0, p2p_latency=0.25, step_overhead=0.5, switch_forward=0.125,
                     switch_backward=0.0625, activation_memory=7)
    scaled = base.compute_scaled(1.5)
    assert (scaled.forward, scaled.backward_full, scaled.switch_forward, scaled.switch_backward) == (1.5, 3.0, 0.1875,
                                                                                                       0.09375)
    assert (scaled.p2p_latency, scaled.step_overhead, scaled.activation_memory) == (0.25, 0.5, 7)
    p, m = 4, 6
    plain = CostModel(forward=1.0, backward_full=2.0)
    program = schedules.lower(schedules.build("gpipe", ranks=p, microbatches=m))
    from sim import simulate

    assert simulate(program, plain).makespan == pytest.approx((m + p - 1) * 3.0, abs=1e-9)
    assert simulate(program, plain.compute_scaled(1.5)).makespan == pytest.approx((m + p - 1) * 4.5, abs=1e-9)
    assert compute_seconds(program, plain.compute_scaled(1.5)) == pytest.approx(m * p * 4.5, abs=1e-9)
    split = CostModel(forward=[1.0, 2.0], backward_input=[0.5, 0.25], backward_weight=[0.75, 1.0]).compute_scaled(2.0)
    assert (split.forward, split.backward_input, split.backward_weight) == ((2.0, 4.0), (1.0, 0.5), (1.5, 2.0))


def test_a_long_run_of_repeats_costs_its_closed_form() -> None:
    """One rank, GPipe at m=5: F k costs f x (1 - d (1 - 1/(k-1))) from k=3, its first pays the switch
    too; the step is the sum (one rank, nothing to wait for)."""
    from sim import simulate
    import schedules

    f, b, switch, discount = 0.004, 0.006, 0.001, 0.3
    costs = CostModel(forward=f, backward_full=b, switch_forward=switch, switch_backward=switch,
                      repeat_discount_forward=discount, repeat_discount_backward=0.0)
    runs = sum(1 - discount * (1 - 1 / (k - 1)) if k >= 3 else 1 for k in range(1, 6))
    expected = f * runs + 5 * b + 2 * switch
    assert simulate(schedules.build("gpipe", ranks=1, microbatches=5), costs).step_time == pytest.approx(expected, abs=1e-9)


def test_compute_that_grows_into_the_step_costs_its_closed_form() -> None:
    """One rank, GPipe at m=3, F 1 ms and B 2 ms, an action starting t into the step costs
    1 + 100/s x min(t, 4 ms) of its price: F at 0, 1 and 2.1 ms (x1, x1.1, x1.21), then the B at
    3.31 ms (x1.331) and two more past the horizon (x1.4 each): 11.572 ms, by hand. Without growth
    9 ms; negative growth makes later actions cheaper by the same law."""
    from sim import simulate
    import schedules

    gpipe = schedules.build("gpipe", ranks=1, microbatches=3)
    costs = CostModel(forward=0.001, backward_full=0.002)
    assert simulate(gpipe, costs).step_time == pytest.approx(0.009, abs=1e-12)
    grown = simulate(gpipe, CostModel(forward=0.001, backward_full=0.002, compute_growth=100.0, growth_horizon=0.004))
    assert grown.step_time == pytest.approx(0.001 + 0.0011 + 0.00121 + 0.002 * 1.331 + 2 * 0.002 * 1.4, abs=1e-9)
    assert [round(t * 1e6) for t in grown.timeline["start"]] == [0, 1000, 2100, 3310, 5972, 8772]
    cheaper = simulate(gpipe, CostModel(forward=0.001, backward_full=0.002, compute_growth=-100.0, growth_horizon=0.004))
    assert cheaper.step_time == pytest.approx(0.001 + 0.0009 + 0.001 * (1 - 0.19) + 0.002 * (1 - 0.271) + 2 * 0.002 * 0.6,
                                              abs=1e-9)


def test_compute_seconds_counts_the_grown_work() -> None:
    """sim.engine.compute_seconds (the typical compute a run's level is taken against) is the
    replay's work, growth included: the closed form above."""
    from sim.engine import compute_seconds
    import schedules

    program = schedules.lower(schedules.build("gpipe", ranks=1, microbatches=3))
    grown = CostModel(forward=0.001, backward_full=0.002, compute_growth=100.0, growth_horizon=0.004)
    assert compute_seconds(program, grown) == pytest.approx(0.011572, abs=1e-9)
    assert compute_seconds(program, CostModel(forward=0.001, backward_full=0.002)) == pytest.approx(0.009, abs=1e-12)
