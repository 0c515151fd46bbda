"""Calibration fidelity terms on synthetic runs (issue 11): role anchoring, the duration
spread, the quality report and calibrating from several runs.

Synthetic runs come from tests/test_calibrate.py's `write_run` (the simulator under a known
machine written out as a run directory), altered here in one known way each, so that every
expected value is a closed form of the alteration, not the calibration's own output.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pandas as pd
import pytest

import test_calibrate as synth
from test_calibrate import write_run

from sim import CostError
from sim.__main__ import main
from sim.calibration import SPREAD_QUANTILES, calibrate, calibrate_runs, spread_quantiles, spread_residuals
from sim.quality import QUALITY_LIMIT, assess
from sim.comparison import compare_run
from sim.measured import read_measured


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two synthetic runs of one machine (1F1B m=8 with profile, interleaved m=8 with profile)."""
    root = tmp_path_factory.mktemp("fidelity")
    write_run(root / "1f1b", "1f1b", 8, profile=True)
    write_run(root / "interleaved", "interleaved", 8, chunks=2, profile=True)
    return root


def test_a_run_without_spread_calibrates_to_none_and_replays_exactly(runs):
    run = read_measured(runs / "1f1b")
    c = assess(calibrate(run), [run])
    assert c.duration_spread == () and c.transfer_spread == ()
    (entry,) = c.quality["runs"]
    assert abs(entry["self_replay_error"]) < 1e-12
    assert entry["step_time_spread"] == 0.0
    assert c.quality["warnings"] == []


def test_quality_reports_peak_bytes_and_warns_on_any_difference(runs, tmp_path):
    run = read_measured(runs / "1f1b")
    (entry,) = assess(calibrate(run), [run]).quality["runs"]
    peaks = run.summary["peak_activation_bytes"]
    assert entry["peak_activation_bytes_measured"] == entry["peak_activation_bytes_simulated"] == peaks
    shutil.copytree(runs / "1f1b", tmp_path / "off")
    summary = json.loads((tmp_path / "off" / "summary.json").read_text())
    summary["peak_activation_bytes"] = [peaks[0], peaks[1] + 1]  # one byte the model did not count
    (tmp_path / "off" / "summary.json").write_text(json.dumps(summary))
    off = read_measured(tmp_path / "off")
    c = assess(calibrate(off), [off])
    assert [w for w in c.quality["warnings"] if "peak activation bytes" in w] == [
        f"{off.path}: the replay's peak activation bytes per rank {peaks} differ from the measured "
        f"{[peaks[0], peaks[1] + 1]}: the memory model misses"]


def test_run_slower_than_its_profile_on_one_role_is_replayed_exactly(runs, tmp_path, monkeypatch):
    """The run's last stage is 0.7 ms slower per B than the profile's shape says (e.g. a busier
    rank): the speed ratio alone would spread that over both stages; anchoring the roles keeps
    each of the run's stages at its measured cost, so the replay is exact."""
    extra = 700_000 * synth.NS
    monkeypatch.setitem(synth.FIXED["B"], "last", synth.FIXED["B"]["last"] + extra)
    truth = write_run(tmp_path / "run", "1f1b", 8)
    shutil.copy(runs / "1f1b" / "profile.json", tmp_path / "run" / "profile.json")  # the unaltered machine's
    run = read_measured(tmp_path / "run")
    c = assess(calibrate(run), [run])
    assert c.speed_ratio["B"] > 1.0
    costs = c.for_run(run)
    layers = [b - a for a, b in run.stage_layers]
    expected_b = [synth.FIXED["B"][role] + n * synth.PER_LAYER["B"] + synth.DISPATCH
                  for role, n in zip(("first", "last"), layers)]
    assert list(costs.backward_full) == pytest.approx(expected_b, abs=1e-12)
    assert c.quality["runs"][0]["step_time_measured"] == pytest.approx(truth, abs=1e-12)
    assert abs(c.quality["runs"][0]["self_replay_error"]) < 1e-12


def _with_factors(run, factor_of):
    """The run with each compute row's duration multiplied by factor_of(position in its group,
    group size), groups as the calibration forms them (step, rank, stage, kind, switching, place class)."""
    from sim.calibration import compute_frame

    tl = run.timeline.copy()
    frame = compute_frame(run)
    keys = ["step", "rank", "stage", "kind", "switch", "place"]
    position = frame.groupby(keys).cumcount()
    size = frame.groupby(keys)["duration"].transform("size")
    factors = pd.Series(1.0, index=tl.index)
    factors[frame.index] = [factor_of(i, n) for i, n in zip(position, size)]
    tl["end"] = tl["start"] + (tl["end"] - tl["start"]) * factors
    return dataclasses.replace(run, timeline=tl), factors[frame.index], size


def test_duration_spread_recovered_from_known_factors(runs):
    """Factors 1 - a, 1 + a in pairs within each step's group of one stage, kind, switching and
    place class (1 for an odd one out): every group's step mean, so every typical cost and every
    rank's factor in a step, stays the machine's, and each action's residual is its factor,
    widened by sqrt(N / (N - 1)) for the N compute actions of its rank in its step. The spread
    is their quantiles, scaled to mean 1."""
    a = 0.2

    def factor(i: int, n: int) -> float:
        if n % 2 and i == n - 1:
            return 1.0
        return 1 - a if i % 2 == 0 else 1 + a

    base = read_measured(runs / "1f1b")
    run, factors, _ = _with_factors(base, factor)
    from sim.calibration import compute_frame

    frame = compute_frame(base)
    per_rank = frame.groupby(["step", "rank"])["duration"].transform("size").to_numpy()
    expected = 1 + (factors.to_numpy() - 1) * np.sqrt(per_rank / (per_rank - 1))
    got = spread_residuals(run)
    assert sorted(got) == pytest.approx(sorted(expected), abs=1e-9)
    quantiles = spread_quantiles(got)
    assert len(quantiles) == SPREAD_QUANTILES
    raw = np.quantile(expected, (np.arange(SPREAD_QUANTILES) + 0.5) / SPREAD_QUANTILES)
    assert quantiles == pytest.approx(raw / raw.mean())
    assert np.mean(quantiles) == pytest.approx(1.0, abs=1e-12)
    # The spread lengthens the replay: a max over paths of noisy sums exceeds that of their means.
    c = calibrate(run)
    assert c.duration_spread == pytest.approx(quantiles)
    plain = dataclasses.replace(c.for_run(run), duration_spread=(), transfer_spread=())
    from sim import simulate

    assert simulate(run.program, c.for_run(run)).makespan > simulate(run.program, plain).makespan


def _with_step_times(runs, root, factors):
    """The synthetic 1F1B run with one step per factor, each step's rows step 0's and its step
    time T x factor (T the run's)."""
    shutil.copytree(runs / "1f1b", root)
    summary = json.loads((root / "summary.json").read_text())
    t = summary["step_times"][0]
    summary["step_times"] = [t * f for f in factors]
    summary["steps"] = len(factors)
    (root / "summary.json").write_text(json.dumps(summary))
    for name in ("timeline.csv", "memory.csv"):
        table = pd.read_csv(runs / "1f1b" / name)
        one = table[table["step"] == 0]
        pd.concat([one.assign(step=k) for k in range(len(factors))]).to_csv(root / name, index=False)
    return read_measured(root), t


def test_quality_reports_the_step_time_spread(runs, tmp_path):
    """Step times T x (0.9, 0.95, 1, 1.05, 1.1): median T, spread (1.05 - 0.95) T / T = 10%,
    beyond QUALITY_LIMIT: one warning, about the spread. Five steps give the median no tighter 95%
    interval than their range: -10% to +10%. The spans stay the run's (T - STEP), so the step
    overheads are STEP + T (f - 1), mean STEP: the replay is the makespan (T - STEP) plus STEP
    times the overhead spread's 16th of 32 quantiles (the median draw, as in
    test_step_overhead_spread_recovered), 1e-9 s either way for the nanosecond rounding."""
    factors = np.array([0.9, 0.95, 1.0, 1.05, 1.1])
    run, t = _with_step_times(runs, tmp_path / "run", factors)
    c = assess(calibrate(run), [run])
    (entry,) = c.quality["runs"]
    assert entry["step_time_spread"] == pytest.approx(0.10, abs=1e-12)
    assert entry["step_time_interval"] == pytest.approx([-0.10, 0.10], abs=1e-12)
    overheads = synth.STEP + t * (factors - 1)
    q = np.maximum(np.quantile(overheads / synth.STEP, (np.arange(32) + 0.5) / 32), 0.0)
    q = q / q.mean()
    assert entry["step_time_simulated"] == pytest.approx(t - synth.STEP + synth.STEP * q[15], abs=2e-9)
    assert entry["steps"] == 5
    assert 0.10 > QUALITY_LIMIT and len(c.quality["warnings"]) == 1 and "spread 10.0%" in c.quality["warnings"][0]
    comparison, _ = compare_run(read_measured(tmp_path / "run"), c.for_run(read_measured(tmp_path / "run")))
    assert comparison.step_time_spread == pytest.approx(0.10, abs=1e-12)
    assert comparison.step_time_interval == pytest.approx((-0.10, 0.10), abs=1e-12)


def test_step_overhead_spread_recovered(runs, tmp_path):
    """Step overheads STEP x (0.5, 0.5, 2) over three steps of one span (the run's step times
    moved by STEP x (f - 1)): the calibration's step overhead is their mean, STEP, its spread the
    factors' 32 quantiles scaled to mean 1, and with no other spread every draw is the run's
    makespan plus STEP times its factor: the lower median of 256 draws (8 of each quantile) is
    the 16th quantile."""
    from sim import simulate

    f = np.array([0.5, 0.5, 2.0])
    base = read_measured(runs / "1f1b")
    t = base.step_times[0]
    run, _ = _with_step_times(runs, tmp_path / "run", 1 + synth.STEP * (f - 1) / t)
    c = calibrate(run)
    assert c.step_overhead == pytest.approx(synth.STEP, abs=1e-12)
    q = np.quantile(f, (np.arange(32) + 0.5) / 32)
    assert c.step_overhead_spread == pytest.approx(q / q.mean(), abs=1e-9)
    assert c.duration_spread == () and c.rank_spread == () and c.step_spread == ()
    result = simulate(run.program, c.for_run(run))
    plain = simulate(run.program, dataclasses.replace(c.for_run(run), step_overhead_spread=()))
    assert result.makespan_ns == plain.makespan_ns
    assert result.step_time == pytest.approx(plain.makespan + synth.STEP * c.step_overhead_spread[15], abs=1e-9)


def test_median_interval_is_the_binomial_order_statistics():
    """48 steps: the 17th and 32nd smallest (P(Binom(48, 1/2) <= 16) = 0.015 <= 0.025 <
    P(<= 17) = 0.030, the ranks of the published tables), relative to the median 24.5; and over
    4000 samples of 48 exponential step times the interval holds the true median ln 2 in
    1 - 2 x 0.015 = 97% of them (exact binomial intervals are conservative)."""
    from math import comb, log

    from sim.comparison import median_interval

    tail = lambda k: sum(comb(48, i) for i in range(k + 1)) / 2 ** 48  # noqa: E731
    assert tail(16) <= 0.025 < tail(17)
    assert median_interval([float(x) for x in range(48, 0, -1)]) == pytest.approx((17 / 24.5 - 1, 32 / 24.5 - 1))
    assert median_interval([]) == (0.0, 0.0)
    rng = np.random.default_rng(7)
    held = 0
    for _ in range(4000):
        x = rng.exponential(1.0, 48)
        low, high = median_interval(list(x))
        mid = np.median(x)
        held += mid * (1 + low) <= log(2) <= mid * (1 + high)
    assert held / 4000 == pytest.approx(1 - 2 * tail(16), abs=0.01)


@pytest.mark.parametrize("wide", [False, True])
def test_a_self_replay_miss_is_told_from_the_steps_noise(runs, tmp_path, wide):
    """21 steps at T x (1 - a, 1 + a, ... , 1): median T; the step overhead raised by 5% of T
    (without its spread) puts the replay at +5%. With a = 1% the median's 95% interval is -1% to +1%: the warning
    calls it a model miss; with a = 10% the interval is -10% to +10% and it says the steps
    cannot tell it from noise."""
    a = 0.10 if wide else 0.01
    run, t = _with_step_times(runs, tmp_path / "run", [1 - a, 1 + a] * 10 + [1.0])
    c = calibrate(run)
    c = dataclasses.replace(c, step_overhead=c.step_overhead + 0.05 * t, step_overhead_spread=())
    quality = assess(c, [run]).quality
    (entry,) = quality["runs"]
    assert entry["self_replay_error"] == pytest.approx(0.05, abs=1e-6)
    assert entry["step_time_interval"] == pytest.approx([-a, a], abs=1e-12)
    (warning,) = [w for w in quality["warnings"] if "replays the run" in w]
    assert ("cannot tell it from noise" in warning) == wide and ("a model miss" in warning) != wide


def test_several_runs_of_one_machine_give_its_parameters(runs):
    pair = [read_measured(runs / "1f1b"), read_measured(runs / "interleaved")]
    both = assess(calibrate_runs(pair), pair)
    for kind in ("F", "B"):
        assert both.compute[kind].per_layer == pytest.approx(synth.PER_LAYER[kind], rel=1e-9)
        for role, value in synth.FIXED[kind].items():
            assert both.compute[kind].fixed[role] == pytest.approx(value + synth.SWITCH[kind], rel=1e-6, abs=1e-12)
    assert both.dispatch_overhead == pytest.approx(synth.DISPATCH, abs=1e-12)
    assert both.send_overhead == pytest.approx(synth.SEND, abs=1e-12)
    assert both.recv_overhead == pytest.approx(synth.RECV, abs=1e-12)
    assert both.step_overhead == pytest.approx(synth.STEP, abs=1e-12)
    assert both.p2p_latency == pytest.approx(synth.LATENCY, abs=1e-12)
    assert both.p2p_bandwidth == pytest.approx(synth.BANDWIDTH, rel=1e-9)
    assert [e["schedule"] for e in both.quality["runs"]] == ["1f1b", "interleaved"]
    assert all(abs(e["self_replay_error"]) < 1e-12 for e in both.quality["runs"])
    assert both.source["runs"] == [str(runs / "1f1b"), str(runs / "interleaved")]


def test_several_runs_average_their_parameters(runs, tmp_path, monkeypatch):
    """A second machine whose send overhead is 100 us more: the mean of the two is fitted."""
    monkeypatch.setattr(synth, "SEND", synth.SEND + 100_000 * synth.NS)
    write_run(tmp_path / "slow", "1f1b", 8, profile=True)
    monkeypatch.undo()
    both = calibrate_runs([read_measured(runs / "1f1b"), read_measured(tmp_path / "slow")])
    assert both.send_overhead == pytest.approx(synth.SEND + 50_000 * synth.NS, abs=1e-12)


def test_several_runs_must_share_model_and_microbatch_size(runs, tmp_path):
    shutil.copytree(runs / "interleaved", tmp_path / "other")
    summary = json.loads((tmp_path / "other" / "summary.json").read_text())
    summary["model"]["hidden"] = 128
    (tmp_path / "other" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(CostError, match="calibrate them separately"):
        calibrate_runs([read_measured(runs / "1f1b"), read_measured(tmp_path / "other")])


def test_cli_calibrates_several_runs_and_stores_the_quality(runs, tmp_path, capsys):
    out = tmp_path / "costs.json"
    assert main(["calibrate", str(runs / "1f1b"), str(runs / "interleaved"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count("self-replay of") == 2 and "warning" not in text
    stored = json.loads(out.read_text())
    assert len(stored["quality"]["runs"]) == 2 and stored["quality"]["warnings"] == []
    assert main(["compare", "--measured", str(runs / "interleaved"), "--costs", str(out)]) == 0
    assert "measured spread, IQR / median: 0.0%" in capsys.readouterr().out


def _with_step_factors(run, factor_of):
    """The run with every compute row of rank r in step k taking factor_of(k, r) times its cost."""
    tl = run.timeline.copy()
    compute = tl["kind"].isin(["F", "B"])
    factor = [factor_of(k, r) if c else 1.0 for r, k, c in zip(tl["rank"], tl["step"], compute)]
    tl["end"] = tl["start"] + (tl["end"] - tl["start"]) * factor
    return dataclasses.replace(run, timeline=tl)


def test_step_spread_recovered_from_slowness_all_ranks_share(runs):
    """Every compute action of step k takes s[k] times its cost on both ranks (mean 1 over the
    3 steps, so the typical costs stay the machine's): the step factors are the s's exactly,
    no rank has a factor of its own, and within a step every group scales alike (no duration
    spread). With only a step spread each draw is the program at one compute speed, so the
    median draw is the step spread's 16th of 32 quantiles (256 draws, 8 of each: the lower
    median is draw 127 of the sorted ones): the model with every compute cost times it. The
    run's compute level under its own calibration is 1 (its compute per step, mean over steps,
    is what the costs hold; the median step's, 0.9 of it, is not)."""
    from sim import simulate
    from sim.calibration import rank_and_step_residuals
    from sim.comparison import compute_level

    s = (0.9, 0.9, 1.2)
    run = _with_step_factors(read_measured(runs / "1f1b"), lambda k, r: s[k])
    own, shared = rank_and_step_residuals(run)
    assert sorted(shared) == pytest.approx(sorted(s), rel=1e-9)
    assert own == pytest.approx(np.ones(len(own)), abs=1e-9)
    c = calibrate(run)
    assert c.duration_spread == () and c.rank_spread == ()
    assert c.step_spread == pytest.approx(spread_quantiles(np.array(s)))
    costs = c.for_run(run)
    plain = dataclasses.replace(costs, step_spread=())
    assert simulate(run.program, costs).makespan == pytest.approx(
        simulate(run.program, plain.compute_scaled(c.step_spread[15])).makespan, rel=1e-6)
    assert compute_level(run, costs, c.dispatch_overhead).level == pytest.approx(1.0, abs=1e-9)


def test_rank_spread_recovered_from_slowness_of_one_rank(runs):
    """Rank 0's compute in step k takes 1 + a[k] times its cost and rank 1's 1 - a[k] T0 / T1
    (T the ranks' compute per step), so every step's whole compute stays the machine's (no
    step spread) and each rank's mean over the steps is 1. Each rank's own factor is then
    its factor over its step's (1), its deviation widened by sqrt(2) for the two ranks the
    step's factor was taken over."""
    from sim import simulate
    from sim.calibration import compute_frame, rank_and_step_residuals

    base = read_measured(runs / "1f1b")
    per_rank = compute_frame(base).groupby("rank")["duration"].sum()  # every step alike
    ratio = per_rank[0] / per_rank[1]
    a = (0.0, 0.2, -0.2)
    g = {0: tuple(1 + x for x in a), 1: tuple(1 - x * ratio for x in a)}
    run = _with_step_factors(base, lambda k, r: g[r][k])
    own, shared = rank_and_step_residuals(run)
    assert shared == pytest.approx(np.ones(3), abs=1e-9)
    expected = [1 + (x - 1) * np.sqrt(2) for x in g[0] + g[1]]
    assert sorted(own) == pytest.approx(sorted(expected), rel=1e-9)
    c = calibrate(run)
    assert c.duration_spread == () and c.step_spread == ()
    assert c.rank_spread == pytest.approx(spread_quantiles(np.array(expected)))
    plain = dataclasses.replace(c.for_run(run), rank_spread=())
    assert simulate(run.program, c.for_run(run)).makespan > simulate(run.program, plain).makespan


def test_runs_at_two_stage_sizes_give_the_in_run_slope(runs, tmp_path, monkeypatch):
    """A profile whose calls at 4 layers cost what the run's do but whose per-layer costs are
    30% steeper (fixed costs lower to match: on the CPU executor a small stage's in-run cost is
    above the profile's, a large one's is not). Anchored at the one stage size of a 1F1B run,
    that slope stays and misprices stages of other sizes; a 1F1B run (4 layers per stage)
    with an interleaved run (2 layers) gives the run's own slope and fixed costs exactly, and
    predicts a third size (interleaved with 4 chunks, 1 layer per stage) exactly."""
    for kind in ("F", "B"):
        for role in synth.FIXED[kind]:
            monkeypatch.setitem(synth.FIXED[kind], role, synth.FIXED[kind][role] - 0.3 * 4 * synth.PER_LAYER[kind])
        monkeypatch.setitem(synth.PER_LAYER, kind, synth.PER_LAYER[kind] * 1.3)
    write_run(tmp_path / "steep", "1f1b", 8, profile=True)
    monkeypatch.undo()
    for name in ("1f1b", "interleaved"):
        shutil.copytree(runs / name, tmp_path / name)
        shutil.copy(tmp_path / "steep" / "profile.json", tmp_path / name / "profile.json")
    truth = write_run(tmp_path / "held-out", "interleaved", 8, chunks=4)
    held_out = read_measured(tmp_path / "held-out")

    from sim import simulate

    alone = calibrate(read_measured(tmp_path / "1f1b"))
    assert alone.compute["F"].per_layer == pytest.approx(1.3 * synth.PER_LAYER["F"], rel=1e-9)
    assert abs(simulate(held_out.program, alone.for_run(held_out)).step_time / truth - 1) > 0.01
    both = calibrate_runs([read_measured(tmp_path / name) for name in ("1f1b", "interleaved")])
    for kind in ("F", "B"):
        assert both.compute[kind].per_layer == pytest.approx(synth.PER_LAYER[kind], rel=1e-9)
        for role, value in synth.FIXED[kind].items():
            assert both.compute[kind].fixed[role] == pytest.approx(value + synth.SWITCH[kind], rel=1e-6, abs=1e-12)
    assert simulate(held_out.program, both.for_run(held_out)).step_time == pytest.approx(truth, rel=1e-12)


def test_a_kind_seen_at_one_stage_size_takes_the_other_kinds_slope_ratio():
    """F at 2 and 4 layers per stage gives its in-run slope, 1/1.3 of the profile's; W, seen at
    4 layers only, gets its profile slope times the same 1/1.3, and fixed costs that put its
    stages at their measured costs (fixed 0.2 / 0.5 ms, 3 ms per layer)."""
    from sim.calibration import LinearCost, in_run_fits

    ms = 1e-3
    f_fixed, w_fixed = {"first": 0.1 * ms, "last": 0.4 * ms}, {"first": 0.2 * ms, "last": 0.5 * ms}
    points = {
        "F": [(r, n, f_fixed[r] + n * 2 * ms) for r in ("first", "last") for n in (2, 4)],
        "W": [(r, 4, w_fixed[r] + 4 * 3 * ms) for r in ("first", "last")],
    }
    profiled = {"F": LinearCost(2.6 * ms, {"first": 0.0, "middle": 0.0, "last": 0.0}),
                "W": LinearCost(3.9 * ms, {"first": 0.0, "middle": 0.3 * ms, "last": 0.0})}
    fits = in_run_fits(points, profiled)
    assert fits["F"].per_layer == pytest.approx(2 * ms, rel=1e-12)
    assert fits["W"].per_layer == pytest.approx(3 * ms, rel=1e-12)
    for role in ("first", "last"):
        assert fits["F"].fixed[role] == pytest.approx(f_fixed[role], abs=1e-15)
        assert fits["W"].fixed[role] == pytest.approx(w_fixed[role], abs=1e-15)
    # A role no run holds keeps the profile's intercept, moved by the present roles' mean shift.
    assert fits["W"].fixed["middle"] == pytest.approx(0.3 * ms + 0.35 * ms, abs=1e-15)
    assert fits["F"].fixed["middle"] == pytest.approx(0.25 * ms, abs=1e-15)


def test_stage_costs_are_the_mean_over_steps(runs, tmp_path):
    """Five steps, two of them 40% slower throughout (every row stretched from the step's
    start): each stage's cost is the mean over steps of its per-step mean, x1.16 the
    unaltered run's, and the per-layer and fixed costs scale with it."""
    shutil.copytree(runs / "1f1b", tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    t = summary["step_times"][0]
    slow = (1.0, 1.4, 1.0, 1.4, 1.0)
    summary["step_times"] = [t * f for f in slow]
    summary["steps"] = len(slow)
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    tl = pd.read_csv(runs / "1f1b" / "timeline.csv")
    one = tl[tl["step"] == 0]
    steps = []
    for k, f in enumerate(slow):
        step = one.assign(step=k)
        step[["start", "end"]] *= f
        steps.append(step)
    pd.concat(steps).to_csv(tmp_path / "run" / "timeline.csv", index=False)
    memory = pd.read_csv(runs / "1f1b" / "memory.csv")
    one = memory[memory["step"] == 0]
    pd.concat([one.assign(step=k) for k in range(len(slow))]).to_csv(tmp_path / "run" / "memory.csv", index=False)
    spell = calibrate(read_measured(tmp_path / "run"))
    plain = calibrate(read_measured(runs / "1f1b"))
    scale = sum(slow) / len(slow)
    for kind in ("F", "B"):
        for a, b in zip(spell.stages, plain.stages):
            assert a[kind] == pytest.approx(scale * b[kind], rel=1e-9)
        assert spell.compute[kind].per_layer == pytest.approx(scale * plain.compute[kind].per_layer, rel=1e-9)
        for role, value in plain.compute[kind].fixed.items():
            assert spell.compute[kind].fixed[role] == pytest.approx(scale * value, rel=1e-9, abs=1e-15)


def test_stage_sizes_that_noise_inverted_keep_the_profile_fit():
    """Runs whose 4-layer stages measured cheaper than their 2-layer ones (a slow spell in one
    run) give no slope: the profile's fit stays, exactly."""
    from sim.calibration import LinearCost, in_run_fits

    ms = 1e-3
    points = {"F": [("first", 2, 5 * ms), ("first", 4, 4 * ms), ("last", 2, 5 * ms), ("last", 4, 4 * ms)]}
    profiled = {"F": LinearCost(1 * ms, {"first": 0.1 * ms, "last": 0.2 * ms})}
    assert in_run_fits(points, profiled) == profiled
