"""zb-auto: the memory limit in the simulated memory timeline under arbitrary costs, valid
and deadlock-free programs, never worse than the heuristic or the handcrafted orders that
fit, the zero-bubble paper's published ZB-1p / ZB-2p bubble rates (Qi et al., ICLR 2024,
Table 5, from its profiled costs, Table 9), and the Python / CSV round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import schedules
from schedules import ScheduleError
from schedules.zb_auto import GRID, AutoCosts, Policy, heuristic, peak_memory, plan
from sim import CostModel, simulate
from sim.zb_search import Objective, auto_costs, auto_schedule, score
from scripts import load_script

DATA = Path(__file__).resolve().parents[1] / "bench" / "zero_bubble_paper.py"


def load_paper():
    return load_script(DATA)


PAPER = load_paper()


@st.composite
def problems(draw):
    """Sizes, a cost model with per-stage times and activations, and a memory limit."""
    p = draw(st.integers(1, 5))
    m = draw(st.integers(1, 3 * p + 2))
    times = st.floats(0.1, 4.0, allow_nan=False)
    costs = CostModel(
        forward=[draw(times) for _ in range(p)],
        backward_input=[draw(times) for _ in range(p)],
        backward_weight=[draw(st.floats(0.0, 4.0, allow_nan=False)) for _ in range(p)],
        p2p_latency=draw(st.floats(0.0, 1.0, allow_nan=False)),
        activation_memory=[draw(st.integers(512, 4096)) for _ in range(p)],
        weight_memory_fraction=draw(st.floats(0.0, 1.0, allow_nan=False)),
    )
    units = auto_costs(costs, p)
    least = max(units.footprint(s) for s in range(p))
    limit = draw(st.floats(least, 2.5 * p + least, allow_nan=False))
    return p, m, costs, limit


def units_held(result) -> list[float]:
    """Per rank, the most activation held in the simulated memory timeline, in units."""
    unit = result.activation_unit_bytes
    return [float(result.memory[result.memory["rank"] == r]["bytes"].max()) / unit for r in range(result.ranks)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from([1.0, None]))
def test_memory_limit_holds_in_the_simulated_timeline(problem, weight_memory):
    """With W keeping the whole footprint (default) or the cost model's share, the program
    validates (deadlock check included), runs to the end in the simulator, and no rank's
    memory timeline goes above the limit."""
    p, m, costs, limit = problem
    schedule = auto_schedule(costs, p, m, limit, weight_memory=weight_memory, max_evaluations=12)
    program = schedules.lower(schedule)
    result = simulate(program, costs)
    assert all(held <= limit * (1 + 1e-9) for held in units_held(result)), (units_held(result), limit)
    assert all(peak <= limit * (1 + 1e-9) for peak in result.peak_activation)
    assert max(peak_memory(schedule, auto_costs(costs, p, weight_memory))) <= limit * (1 + 1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(list(Objective)))
def test_search_is_never_worse_than_the_heuristic_or_the_handcrafted_orders(problem, objective):
    p, m, costs, limit = problem
    found = score(simulate(auto_schedule(costs, p, m, limit, objective=objective, max_evaluations=12), costs), objective)
    units = auto_costs(costs, p)
    for policy in GRID:
        try:
            candidate = heuristic(p, m, units, limit, policy).schedule
        except ScheduleError:
            continue
        assert found <= score(simulate(candidate, costs), objective)
    for name in ("zb-h1", "zb-h2"):
        hand = schedules.build(name, p, m)
        if max(peak_memory(hand, units)) <= limit:  # W keeps whole microbatches (the default)
            assert found <= score(simulate(hand, costs), objective), name


def test_defaults_are_zb_h1_at_equal_unit_costs():
    """T_F = T_B = T_W, no transfer time, K = p: the heuristic builds ZB-H1's order."""
    for p, m in [(2, 4), (4, 8), (4, 13), (6, 12)]:
        assert schedules.build("zb-auto", p, m).order == schedules.build("zb-h1", p, m).order


def test_memory_limit_decides_the_warm_up():
    """Equal unit costs: K = 2p gives ZB-H2's zero-bubble parallelogram (rank-span bubble 0,
    2p-1 in flight); K = p keeps 1F1B's p; a limit between gives a peak within it."""
    costs = CostModel(forward=1, backward_input=1, backward_weight=1)
    for p, m in [(3, 9), (4, 12)]:
        wide = simulate(auto_schedule(costs, p, m, 2 * p), costs)
        assert wide.bubble_ratio_rank_span == 0 and max(wide.peak_activation) == 2 * p - 1
        narrow = simulate(auto_schedule(costs, p, m, p), costs)
        assert max(narrow.peak_activation) == p and narrow.bubble_ratio_rank_span > 0
        middle = simulate(auto_schedule(costs, p, m, p + 1.5), costs)
        assert max(middle.peak_activation) <= p + 1.5
        assert wide.makespan <= middle.makespan <= narrow.makespan


def test_limit_below_one_microbatch_is_one_clear_error():
    with pytest.raises(ScheduleError, match="below one microbatch's activations"):
        schedules.build("zb-auto", 3, 6, memory_limit=0.5)
    with pytest.raises(ScheduleError, match="costs give 2 stage"):
        schedules.build("zb-auto", 3, 6, costs=AutoCosts.uniform(2))
    with pytest.raises(ScheduleError, match="must be > 0"):
        AutoCosts.uniform(2, forward=0.0)


@pytest.mark.parametrize("setting", [s for s in PAPER.SETTINGS if s.ranks <= 16],
                         ids=lambda s: f"{s.model}-m{s.microbatches}")
def test_heuristic_gives_the_published_zb_1p_and_zb_2p(setting):
    """The paper's memory model: a forward holds M_B, I leaves M_W for W (Table 1)."""
    costs = PAPER.cost_model(setting, setting.weight_memory_fraction)
    units = auto_costs(costs, setting.ranks, weight_memory=None)
    for limit, name in ((setting.ranks, "zb-1p"), (2 * setting.ranks, "zb-2p")):
        best = plan(setting.ranks, setting.microbatches, units, limit)
        result = simulate(best.schedule, costs)
        assert round(result.bubble_ratio_rank_span, 4) == setting.rates[name]
        assert max(result.peak_activation) <= limit * (1 + 1e-9)


@pytest.mark.parametrize("setting", [s for s in PAPER.SETTINGS if s.model == "6.2B"][:2],
                         ids=lambda s: f"{s.model}-m{s.microbatches}")
def test_search_beats_the_published_zb_2p(setting):
    costs = PAPER.cost_model(setting, setting.weight_memory_fraction)
    schedule = auto_schedule(costs, setting.ranks, setting.microbatches, 2 * setting.ranks,
                             objective=Objective.SPAN, weight_memory=None)
    assert simulate(schedule, costs).bubble_ratio_rank_span < setting.rates["zb-2p"]


def test_policy_warm_up_is_clipped_to_a_valid_order():
    """Any warm-up depths give a valid order within the limit (the local search's moves)."""
    units = AutoCosts.uniform(4, 1.0, 1.5, 0.5, p2p=0.1)
    for depths in [(1, 1, 1, 1), (9, 9, 9, 9), (2, 5, 1, 7), (6, 4, 3, 1)]:
        built = heuristic(4, 10, units, 6, Policy(warmup=depths)).schedule
        schedules.validate(built)
        assert max(peak_memory(built, units)) <= 6


def test_saved_as_csv_it_loads_back_unchanged(tmp_path):
    costs = CostModel(forward=1.0, backward_input=1.3, backward_weight=0.6, p2p_latency=0.05)
    program = schedules.lower(auto_schedule(costs, 3, 7, 4.5))
    schedules.save_csv(program, tmp_path / "zb-auto.csv")
    loaded = schedules.load_program_csv(tmp_path / "zb-auto.csv")
    assert loaded.streams == program.streams


def test_search_is_deterministic():
    costs = CostModel(forward=1.0, backward_input=1.2, backward_weight=0.7, p2p_latency=0.1)
    first = auto_schedule(costs, 4, 10, 6)
    assert all(auto_schedule(costs, 4, 10, 6).order == first.order for _ in range(2))


# From the command line: `sim compare/sweep --schedules zb-auto --memory-limit K`.

def _compare_rows(capsys, *argv: str) -> dict[str, dict]:
    from sim.__main__ import main

    assert main(["compare", "--json", *argv]) == 0
    return {row["schedule"]: row for row in json.loads(capsys.readouterr().out)}


@pytest.mark.parametrize("limit", [4, 6, 8])
def test_cli_memory_limit_bounds_the_peak_and_never_loses_to_the_handcrafted_orders(capsys, limit):
    # T_F = T_B = T_W = 1 on p = 4: zb-h1 holds p = 4 microbatches, zb-h2 2p - 1 = 7
    # (Qi et al. 2024, Sec. 2); zb-auto's search starts from whichever fits the limit.
    rows = _compare_rows(
        capsys, "--schedules", "zb-h1,zb-h2,zb-auto", "--ranks", "4", "--microbatches", "8",
        "--forward", "1", "--backward", "1", "--weight", "1", "--memory-limit", str(limit),
    )
    auto = rows["zb-auto"]
    assert auto["peak_activation"] <= limit
    fitting = [rows[name]["makespan"] for name, peak in (("zb-h1", 4), ("zb-h2", 7)) if peak <= limit]
    assert auto["makespan"] <= min(fitting)


def test_cli_memory_limit_without_zb_auto_is_refused(capsys):
    from sim.__main__ import main

    assert main(["compare", "--schedules", "1f1b", "--memory-limit", "8"]) == 2
    assert main(["sweep", "--schedules", "1f1b", "--memory-limit", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("--memory-limit applies to zb-auto only" in line for line in err)
