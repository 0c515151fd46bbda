"""Calibration and simulated-vs-measured comparison on synthetic run directories.

A synthetic run is what the executor would write if the machine behaved exactly like a
known cost model: the program is simulated under that model and written out as a run
directory (timeline.csv, memory.csv, program.json, summary.json, and for the
calibration run a profile.json of stage calls at 1, 2 and 4 layers and a ping-pong).
Like the executor's, its compute rows end before the loop's dispatch gap and its step
times are barrier to barrier (the streams' end plus a fixed step overhead).

Calibrating on a synthetic 1F1B run must give back every known parameter, replaying it
must reproduce it (error 0), and the calibration must predict synthetic GPipe and
interleaved runs of other m exactly: more, smaller stages and other roles (middle) per
stage come from the fitted fixed + per-layer costs, not from the run's stage costs, and
GPipe's runs of repeated F (then B) actions skip the switch cost that 1F1B pays on
almost every action.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import schedules
from schedules import ScheduleError
from schedules.timeline import TIMELINE_COLUMNS
from sim import CostError, CostModel, simulate
from schedules.stages import balanced_layers, role_of
import sim.calibration as calibration_module
from sim import share_choice
from sim.calibration import Calibration, calibrate, calibrate_runs, fit_idle_share
from sim.transfers import transfer_rows, transfer_time
from sim.__main__ import main
from sim.comparison import compare_run, compute_level
from sim.measured import read_measured
from sim.sources import load_costs

NS = 1e-9
LAYERS = 8
ROWS = 16
MODEL = {"model": "mlp", "layers": LAYERS, "hidden": 64, "seed": 0}
BOUNDARY = 512 * 1024  # bytes per microbatch across a boundary
# The machine: whole nanoseconds, so that every simulated time is exact.
PER_LAYER = {"F": 2_000_000 * NS, "B": 4_100_000 * NS}
FIXED = {
    "F": {"first": 300_000 * NS, "middle": 100_000 * NS, "last": 700_000 * NS},
    "B": {"first": 200_000 * NS, "middle": 150_000 * NS, "last": 900_000 * NS},
}
DISPATCH = 5_000 * NS  # the executor's gap after each compute action
SWITCH = {"F": 120_000 * NS, "B": 250_000 * NS}  # extra for an action not repeating the previous one
DISCOUNT = {"F": 0.0, "B": 0.0}  # what a long run of repeats saves (sim.costs.repeat_factor)
SEND = 200_000 * NS
WAKE = 0.0  # more per SEND whose receiver already waits (none unless a test sets it)
RECV = 30_000 * NS
STEP = 500_000 * NS
BANDWIDTH = 2_097_152_000.0  # bytes/s: 512 KiB in 250 us
LATENCY = 150_000 * NS  # in-run: a transfer takes 400 us
PINGPONG_LATENCY = 80_000 * NS  # the idle-machine ping-pong is faster than in-run transfers
ACT_PER_LAYER = 4096
ACT_FIXED = {"first": 0, "middle": 4096, "last": 6144}


def stage_value(table, kind, role, layers):
    return table[kind][role] + layers * PER_LAYER[kind]


PLACES: dict = {}  # the machine's place factors (none unless a test sets them)
CORES = None  # processors the machine's ranks share (None: one each, unless a test sets them)
IDLE = 0.0  # with CORES: the share of a core a rank not computing takes
LOAD = 0.0  # what a transfer takes longer per rank computing meanwhile (none unless a test sets it)
POST = 0.0  # rank time per receive posted before a rank's first action (none unless a test sets it)
POST_AHEAD = 0  # where the executor posts its receives ("step": all at the step's start)
GROWTH = (0.0, 0.0)  # per second and up to what start a compute action's cost grows (sim.costs.growth_factor)
# An F whose backward is split costs a plain F's times SPLIT_FACTOR plus SPLIT_PER_LAYER per layer
# (the same as a plain F unless a test sets them).
SPLIT_FACTOR = 1.0
SPLIT_PER_LAYER = 0.0


def split_forward_value(role, layers):
    return stage_value(FIXED, "F", role, layers) * SPLIT_FACTOR + layers * SPLIT_PER_LAYER


def true_costs(num_stages: int) -> CostModel:
    """The machine's cost model for a balanced cut of the model into `num_stages` stages."""
    roles = [role_of(s, num_stages) for s in range(num_stages)]
    counts = [b - a for a, b in balanced_layers(LAYERS, num_stages)]
    per = {k: [stage_value(FIXED, k, r, n) + DISPATCH for r, n in zip(roles, counts)] for k in ("F", "B")}
    return CostModel(
        forward=per["F"], backward_full=per["B"],
        forward_split=[split_forward_value(r, n) + DISPATCH for r, n in zip(roles, counts)], p2p_latency=LATENCY, p2p_bandwidth=BANDWIDTH,
        p2p_activation_bytes=BOUNDARY, activation_memory=[ACT_FIXED[r] + n * ACT_PER_LAYER for r, n in zip(roles, counts)],
        send_overhead=SEND, wake_overhead=WAKE, recv_overhead=RECV, step_overhead=STEP,
        switch_forward=SWITCH["F"], switch_backward=SWITCH["B"], repeat_discount_forward=DISCOUNT["F"],
        repeat_discount_backward=DISCOUNT["B"], place_factors=PLACES, cores=CORES, idle_share=IDLE,
        p2p_load_latency=LOAD, post_overhead=POST, post_ahead=POST_AHEAD, compute_growth=GROWTH[0],
        growth_horizon=GROWTH[1],
    )


def write_run(path: Path, name: str, m: int, chunks=None, steps: int = 3, profile: bool = False,
              profile_slowdown: float = 1.0, skew: tuple[float, ...] = (),
              stalls: dict[int, float] | None = None, one_way: bool = False, clocks: str | None = None,
              rank0_late: float = 0.0, lag: float = 0.0) -> float:
    """A synthetic run directory of `name` at p=2; returns its (true) step time.

    Its profile times both ways of running a stage (F, B; F_split, I, W), as the executor's
    does, or with `one_way` only the run's (F and B, or F, I and W), as it did before.

    `profile_slowdown` multiplies the profile's stage-call times (the profile runs outside the
    steps, e.g. on a machine busy otherwise); `skew[k]` is added to rank 1's times in step k
    (its clock, started at its own barrier exit, is that much behind rank 0's); `stalls[k]`
    multiplies every time of step k, its step time included (a machine that stalled then);
    `clocks` is summary.json's (schedules.timeline), left out by default as in runs from before it;
    `rank0_late` puts the ranks on one clock (``clocks: "host"``) with rank 0 leaving each step's
    barrier that long after rank 1: every row is that much later but rank 1's first RECV, which
    starts as before and waits that much longer; the step times (rank 0's) do not change. `lag`
    (one clock) delays every row that long after the ranks' common step start, and the step
    times with them: what the executor does before its first action that posting does not
    explain."""
    schedule = schedules.build(name, ranks=2, microbatches=m, chunks=chunks)
    program = schedules.lower(schedule)
    n = schedule.num_stages
    result = simulate(program, true_costs(n))
    path.mkdir(parents=True)
    one = result.timeline.copy()
    compute = one["kind"].isin(["F", "B", "I", "W"])
    one.loc[compute, "end"] -= DISPATCH  # the row ends before the executor's loop gap
    one["source"] = "measured"
    timeline = [one.assign(step=k) for k in range(steps)]
    for k, offset in enumerate(skew):
        late = timeline[k]["rank"] == 1
        timeline[k].loc[late, ["start", "end"]] += offset
    if lag:
        clocks = "host"
        for rows in timeline:
            rows[["start", "end"]] += lag
    if rank0_late:
        clocks = "host"
        for rows in timeline:
            first = rows.index[(rows["rank"] == 1)][0]
            before = rows.at[first, "start"]
            rows[["start", "end"]] += rank0_late
            rows.at[first, "start"] = before
    stalls = stalls or {}
    for k, factor in stalls.items():
        timeline[k][["start", "end"]] *= factor
    import pandas as pd

    pd.concat(timeline)[list(TIMELINE_COLUMNS)].to_csv(path / "timeline.csv", index=False)
    if CORES is not None:  # the executor's cpu.csv: each compute action's time on a core of its own
        alone = simulate(program, dataclasses.replace(true_costs(n), cores=None, compute_growth=0.0)).timeline
        alone = alone[alone["kind"].isin(["F", "B", "I", "W"])]
        # its price, grown at the time it started in the run (whole ns, as the engine rounds)
        started = result.timeline.set_index(["rank", "action"]).loc[list(zip(alone["rank"], alone["action"])), "start"]
        price = np.round((alone["end"] - alone["start"]).to_numpy() / NS)
        grown = np.round(price * (1.0 + GROWTH[0] * NS * np.minimum(np.round(started.to_numpy() / NS),
                                                                    round(GROWTH[1] / NS))))
        cpu = alone[["rank", "action"]].assign(thread_cpu=grown * NS - DISPATCH)
        pd.concat([cpu.assign(step=k, thread_cpu=cpu["thread_cpu"] * stalls.get(k, 1.0)) for k in range(steps)])[
            ["step", "rank", "action", "thread_cpu"]].to_csv(
            path / "cpu.csv", index=False)
    memory = result.memory.assign(source="measured")
    pd.concat([memory.assign(step=k) for k in range(steps)]).to_csv(path / "memory.csv", index=False)
    schedules.save_json(program, path / "program.json")
    step_time = result.makespan + STEP + lag  # this program ends on a compute row; its gap is in the makespan
    layers = balanced_layers(LAYERS, n)
    stage_costs = []
    for s, (a, b) in enumerate(layers):
        stage_costs.append({
            "stage": s, "rank": schedule.stage_to_rank[s], "chunk": schedule.chunk_of(s), "layers": [a, b],
            "output_bytes_per_microbatch": BOUNDARY if s < n - 1 else None,
            "activation_bytes": result.resolved.memory[s],
        })
    summary = {
        "schedule": name, "ranks": 2, "microbatches": m, "chunks": schedule.chunks, "stages": n,
        "model": {**MODEL, "batch_size": ROWS * m}, "batch_size": ROWS * m, "microbatch_sizes": [ROWS] * m,
        "steps": steps, "warmup": 1, "step_times": [step_time * stalls.get(k, 1.0) for k in range(steps)],
        "step_time_median": step_time,
        "peak_activation_bytes": result.peak_activation_bytes, "stage_costs": stage_costs, "post_ahead": POST_AHEAD,
    }
    if clocks is not None:
        summary["clocks"] = clocks
        summary["rank_step_starts"] = [[rank0_late, 0.0]] * steps
    if CORES is not None:  # a CPU run on one host records its cores
        summary.update({"device": "cpu", "cpu_cores": CORES, "local_world_size": 2})
    (path / "summary.json").write_text(json.dumps(summary))
    if profile:
        split = any(a.kind is schedules.Kind.I for stream in program.streams for a in stream)

        def calls(role, k):  # what the profile's stage calls take, each switching
            plain = {kind: stage_value(FIXED, kind, role, k) + SWITCH[kind] for kind in ("F", "B")}  # F, B alternate
            half = (stage_value(FIXED, "B", role, k) + DISPATCH) / 2 - DISPATCH  # the machine's I = W = B / 2
            apart = {"F_split": split_forward_value(role, k) + SWITCH["F"], "I": half + SWITCH["B"],
                     "W": half + SWITCH["B"]}
            if not one_way:
                return {**plain, **apart}
            # the run's way only; a split run's forward under "F", as such profiles named it
            return {("F" if kind == "F_split" else kind): v for kind, v in apart.items()} if split else plain

        records = [
            {"rank": rank, "role": role, "layers": k,
             **{kind: [value * profile_slowdown] * 3 for kind, value in calls(role, k).items()},
             "activation_bytes": ACT_FIXED[role] + k * ACT_PER_LAYER}
            for rank in (0, 1) for role in ("first", "middle", "last") for k in (1, 2, 4)
        ]
        sizes = (4, 65536, 1 << 20, 4 << 20)
        p2p = {str(size): [PINGPONG_LATENCY + size / BANDWIDTH] * 5 for size in sizes}
        (path / "profile.json").write_text(json.dumps({
            "layers": {"rows": ROWS, "repeats": 3, "warmup": 1, "split": split, "records": records},
            "p2p": {"repeats": 5, "warmup": 1, "one_way_seconds": p2p},
        }))
    return step_time


def assert_predicts(calibration, root: Path, cases, rel: float) -> None:
    """Each (schedule, m, chunks) of `cases`, run by the machine (`write_run` under `root`), is
    predicted by `calibration` to within `rel` of its true step time."""
    for name, m, chunks in cases:
        truth = write_run(root / f"{name}-{m}", name, m, chunks)
        schedule = schedules.build(name, ranks=2, microbatches=m, chunks=chunks)
        assert simulate(schedule, calibration.cost_model(schedule.num_stages)).step_time == pytest.approx(truth, rel=rel)


@pytest.fixture(scope="module")
def calibration_run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("runs") / "1f1b-m8"
    write_run(path, "1f1b", 8, profile=True)
    return path


def test_calibration_recovers_every_parameter(calibration_run):
    c = calibrate(read_measured(calibration_run))
    for kind in ("F", "B"):
        assert c.speed_ratio[kind] == pytest.approx(1.0, rel=1e-12)
        assert c.compute[kind].per_layer == pytest.approx(PER_LAYER[kind], rel=1e-9)
        for role, value in FIXED[kind].items():  # the fit is of switching actions
            assert c.compute[kind].fixed[role] == pytest.approx(value + SWITCH[kind], rel=1e-6, abs=1e-12)
    assert (c.switch_forward, c.switch_backward) == pytest.approx((SWITCH["F"], SWITCH["B"]), abs=1e-12)
    assert c.dispatch_overhead == pytest.approx(DISPATCH, abs=1e-12)
    assert c.send_overhead == pytest.approx(SEND, abs=1e-12)
    assert c.recv_overhead == pytest.approx(RECV, abs=1e-12)
    assert c.step_overhead == pytest.approx(STEP, abs=1e-12)
    assert c.p2p_bandwidth == pytest.approx(BANDWIDTH, rel=1e-9)
    assert c.p2p_latency == pytest.approx(LATENCY, abs=1e-12)
    assert c.diagnostics["pingpong_latency"] == pytest.approx(PINGPONG_LATENCY, abs=1e-12)
    assert c.activation.per_layer == pytest.approx(ACT_PER_LAYER)
    assert {r: round(v) for r, v in c.activation.fixed.items()} == ACT_FIXED
    assert (c.rows, c.num_layers, c.boundary_bytes, dict(c.model)) == (ROWS, LAYERS, BOUNDARY, MODEL)


@pytest.mark.parametrize("clocks", [None, "host"])
def test_a_send_that_wakes_its_receiver_is_recovered(tmp_path, monkeypatch, clocks):
    """A machine whose two ranks share one core and where a SEND whose receiver already waits
    costs its sender 70 us more (sim.costs ``wake_overhead``: one core, always full): the
    calibration tells the two kinds of SEND apart (a 1F1B run at p=2 has both), gives back the
    send overhead and the wake exactly, replays its run and predicts other schedules to the
    engine's rounding. Without the wake the mean of the two kinds misses the held-out runs;
    with the cores unrecorded (a core per rank as far as the run says) no wake is fitted."""
    monkeypatch.setitem(globals(), "WAKE", 70_000 * NS)
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)  # a measured row ends at its action's end
    write_run(tmp_path / "calib", "1f1b", 8, profile=True, clocks=clocks)
    run = read_measured(tmp_path / "calib")
    woke = [t.woke for t in transfer_rows(run)]
    assert any(woke) and not all(woke)
    c = calibrate(run)
    assert (c.send_overhead, c.wake_overhead) == pytest.approx((SEND, WAKE), abs=1e-12)
    comparison, _ = compare_run(run, c.for_run(run))
    assert abs(comparison.step_time_error) < 1e-9
    for other, m, k in (("gpipe", 4, None), ("zb-h1", 6, None), ("interleaved", 4, 2)):
        truth = write_run(tmp_path / f"{other}-{m}", other, m, k)
        held_out = read_measured(tmp_path / f"{other}-{m}")
        assert simulate(held_out.program, c.for_run(held_out)).step_time == pytest.approx(truth, rel=1e-9)
    share = float(np.mean(woke))
    mean_only = dataclasses.replace(c, send_overhead=SEND + share * WAKE, wake_overhead=0.0)
    errors = [simulate(held_out.program, x.for_run(held_out)).step_time / truth - 1 for x in (c, mean_only)]
    assert abs(errors[0]) < 1e-9 < 1e-4 < abs(errors[1])
    summary = json.loads((tmp_path / "calib" / "summary.json").read_text())
    del summary["cpu_cores"]
    (tmp_path / "calib" / "summary.json").write_text(json.dumps(summary))
    assert calibrate(read_measured(tmp_path / "calib")).wake_overhead == 0.0


def test_replay_of_the_calibration_run_is_exact(calibration_run):
    run = read_measured(calibration_run)
    comparison, result = compare_run(run, calibrate(run).for_run(run))
    assert abs(comparison.step_time_error) < 1e-12
    assert comparison.start_mae == 0.0
    # The simulated rows hold the dispatch gap after the last compute action; measured ones end before it.
    assert comparison.makespan_simulated - comparison.makespan_measured == pytest.approx(DISPATCH, abs=1e-12)
    assert comparison.peak_activation_bytes_simulated == comparison.peak_activation_bytes_measured
    # Measured rows leave out the dispatch gap of every compute action, so they are that much less busy.
    computes = sum(a.kind.is_compute for stream in run.program.streams for a in stream)
    busy = sum(result.busy) - computes * DISPATCH
    assert comparison.bubble_ratio_measured == pytest.approx(1 - busy / (2 * comparison.makespan_measured), rel=1e-9)
    assert comparison.bubble_ratio_simulated == pytest.approx(result.bubble_ratio, rel=1e-12)


def test_far_out_steps_are_left_out_and_every_parameter_recovered(tmp_path, monkeypatch):
    """Two of twelve steps ran 3x and 2.5x slower throughout (a stalled machine): the mean-fitted
    overheads and latency would take them in; left out by Tukey's fence, every parameter is
    the machine's again and the run replays its median step exactly. (Two of eight would sit on
    the fence: a quarter of the steps stalled puts Q3 between a typical step and a stalled one.)"""
    write_run(tmp_path / "run", "1f1b", 8, steps=12, profile=True, stalls={2: 3.0, 5: 2.5})
    run = read_measured(tmp_path / "run")
    assert calibration_module.far_out_steps(run) == [2, 5]
    c = calibrate(run)
    assert c.diagnostics["far_out_steps"] == {str(run.path): [2, 5]}
    assert "left out of every fit: 2 far-out step(s)" in c.report()
    assert (c.dispatch_overhead, c.send_overhead, c.recv_overhead, c.step_overhead, c.p2p_latency) == pytest.approx(
        (DISPATCH, SEND, RECV, STEP, LATENCY), abs=1e-12)
    for kind in ("F", "B"):
        assert c.compute[kind].per_layer == pytest.approx(PER_LAYER[kind], rel=1e-9)
    comparison, _ = compare_run(run, c.for_run(run))
    assert abs(comparison.step_time_error) < 1e-12
    # The compute level leaves them out too: the run computes what its calibration prices
    # (with them, (10 + 3 + 2.5) / 12 = 1.29 of it).
    assert compute_level(run, c.for_run(run), c.dispatch_overhead).level == pytest.approx(1.0, rel=1e-12)
    # Kept in, the stalled steps' longer gaps and transfers would go into the means (what the
    # fence is for): the same run with the fence switched off.
    monkeypatch.setattr(calibration_module, "far_out_steps", lambda run: [])
    whole = calibrate(run)
    assert whole.send_overhead > 1.2 * SEND and whole.p2p_latency > 1.2 * LATENCY
    assert compare_run(run, whole.for_run(run))[0].step_time_error > 0.03  # +5.7% when written


@pytest.mark.parametrize("times,far", [
    ([1.0] * 10, []),
    ([1.0, 1.1, 0.9, 1.0, 5.0, 1.05, 0.95, 1.0], [4]),
    ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], []),  # Q1 2.75, Q3 6.25: the fence 16.75
    ([1.0, 1.0, 1.0, 1.0, 1.0001], [4]),  # no spread at all: anything above is far out
    ([1.0] * 6 + [3.0, 3.0], []),  # a quarter stalled: Q3 = 1.5, the fence 3.0, nothing beyond it
    ([1.0] * 10 + [3.0, 3.0], [10, 11]),
    ([1.0, 9.0, 1.0], []),  # fewer than four steps: no quartiles to fence with
])
def test_far_out_steps_by_tukeys_fence(tmp_path, times, far):
    write_run(tmp_path / "run", "1f1b", 2, steps=len(times))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (tmp_path / "run" / "summary.json").write_text(json.dumps({**summary, "step_times": times}))
    assert calibration_module.far_out_steps(read_measured(tmp_path / "run")) == far


def test_nonnegative_least_squares_meets_the_optimality_conditions():
    """Karush-Kuhn-Tucker conditions of min |Ax - b|^2 subject to x >= 0, the independent check:
    x >= 0, the gradient A'(Ax - b) is 0 where x > 0 and >= 0 where x = 0."""
    rng = np.random.default_rng(7)
    clamped = 0
    for _ in range(200):
        a = rng.random((30, 4)) * (rng.random(4) < 0.9)  # some columns empty
        b = rng.normal(size=30)
        x = calibration_module.nonnegative_least_squares(a, b)
        gradient = a.T @ (a @ x - b)
        assert (x >= 0).all()
        assert np.allclose(gradient[x > 0], 0, atol=1e-9)
        assert (gradient[x == 0] >= -1e-9).all()
        clamped += int((np.linalg.lstsq(a, b, rcond=None)[0] < 0).any())
    assert clamped > 50  # the unconstrained fit went negative often: the constraint was exercised
    # A fit whose unconstrained solution is (2, -1): clamping gives (2, 0), the constrained optimum
    # moves the first coefficient to the mean the first column then has to explain alone.
    a = np.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    b = np.array([1.0, 2.0, 1.0, 2.0])
    assert np.linalg.lstsq(a, b, rcond=None)[0] == pytest.approx([2.0, -1.0])
    assert calibration_module.nonnegative_least_squares(a, b) == pytest.approx([1.5, 0.0])


def test_a_profile_slower_than_the_run_is_scaled_to_the_run(tmp_path):
    """The profile's level is the profile's machine state, not the run's: with every profile
    call 25% slower, the speed ratio must be exactly 1/1.25 and the fitted costs the run's."""
    write_run(tmp_path / "calib", "1f1b", 8, profile=True, profile_slowdown=1.25)
    c = calibrate(read_measured(tmp_path / "calib"))
    for kind in ("F", "B"):
        assert c.speed_ratio[kind] == pytest.approx(1 / 1.25, rel=1e-12)
        assert c.compute[kind].per_layer == pytest.approx(PER_LAYER[kind], rel=1e-9)
        for role, value in FIXED[kind].items():
            assert c.compute[kind].fixed[role] == pytest.approx(value + SWITCH[kind], rel=1e-6, abs=1e-12)
    truth = write_run(tmp_path / "held-out", "interleaved", 8, chunks=2)
    schedule = schedules.build("interleaved", ranks=2, microbatches=8, chunks=2)
    assert simulate(schedule, c.cost_model(schedule.num_stages)).step_time == pytest.approx(truth, rel=1e-12)


def test_transfer_time_is_recovered_under_skewed_rank_clocks(tmp_path):
    """Each rank's clock starts at its own barrier exit: rank 1's clock is off by a different
    amount in every step, either way, by more than a transfer takes. The offset must be taken
    out with the right sign for the in-run transfer time to come back exactly."""
    skew = (3_000_000 * NS, -1_700_000 * NS, 260_000 * NS)  # a transfer takes 400 us
    write_run(tmp_path / "skewed", "1f1b", 8, profile=True, skew=skew)
    write_run(tmp_path / "aligned", "1f1b", 8, profile=True)
    skewed, aligned = read_measured(tmp_path / "skewed"), read_measured(tmp_path / "aligned")
    assert transfer_time(transfer_rows(aligned)) == pytest.approx(LATENCY + BOUNDARY / BANDWIDTH, abs=1e-12)
    assert transfer_time(transfer_rows(skewed)) == pytest.approx(LATENCY + BOUNDARY / BANDWIDTH, abs=1e-12)
    c = calibrate(skewed)
    assert c.p2p_latency == pytest.approx(LATENCY, abs=1e-12)
    assert c.p2p_bandwidth == pytest.approx(BANDWIDTH, rel=1e-9)
    # Gaps within a rank do not see another rank's clock.
    assert (c.dispatch_overhead, c.send_overhead, c.recv_overhead) == pytest.approx((DISPATCH, SEND, RECV), abs=1e-12)


def test_a_late_rank_0_is_timed_from_its_own_first_row(tmp_path):
    """Rank 0's step time runs from its own barrier exit: where it left 300 us after rank 1
    (one clock), the simulated makespan stands for the time from rank 0's first row (at its
    start here) to the last row's end, not from rank 1's earlier first row, so the step
    overhead, the posting cost and the replay come out as for the run without the delay."""
    truth = write_run(tmp_path / "late", "1f1b", 8, profile=True, rank0_late=300_000 * NS)
    run = read_measured(tmp_path / "late")
    assert run.one_clock and run.rank_start(2, 0) == 300_000 * NS and run.rank_start(2, 1) == 0.0
    assert run.timeline.groupby("step")["start"].min().tolist() == [0.0] * 3  # rank 1's first RECV
    c = calibrate(run)
    assert c.step_overhead == pytest.approx(STEP, abs=1e-12)
    assert c.post_overhead == 0.0
    comparison, _ = compare_run(run, c.for_run(run))
    assert comparison.step_time_simulated == pytest.approx(truth, rel=1e-9)


def test_time_before_rank_0s_first_row_is_step_overhead(tmp_path):
    """On one clock, time every rank spends after its barrier before its first row (500 us here)
    that the posting cost does not explain (1F1B at p=2: every rank posts alike, so none is
    fitted) belongs to the step overhead: the simulator's time 0 is where rank 0's first row
    says. The run replays itself and predicts GPipe exactly; timed from rank 0's step start
    instead, the overhead loses those 500 us and every prediction comes out that much short."""
    lag = 500_000 * NS
    write_run(tmp_path / "lag", "1f1b", 8, profile=True, lag=lag)
    run = read_measured(tmp_path / "lag")
    assert run.one_clock and run.rank_start(1, 0) == 0.0
    assert run.timeline.groupby("step")["start"].min().tolist() == [lag] * 3
    c = calibrate(run)
    assert c.post_overhead == 0.0
    assert c.step_overhead == pytest.approx(STEP + lag, abs=1e-12)
    comparison, _ = compare_run(run, c.for_run(run))
    assert comparison.step_time_simulated == pytest.approx(comparison.step_time_measured, rel=1e-9)
    truth = write_run(tmp_path / "gpipe", "gpipe", 8, lag=lag)
    schedule = schedules.build("gpipe", ranks=2, microbatches=8)
    assert simulate(schedule, c.cost_model(schedule.num_stages)).step_time == pytest.approx(truth, rel=1e-9)


def test_a_run_on_one_clock_is_read_as_it_is(tmp_path, monkeypatch):
    """Where the run says its ranks share one clock (``clocks: "host"``) no offset is estimated:
    each transfer is its SEND's start and its RECV's start and end as written, and the law comes
    back from them exactly; a rank that started late stays late (the skew is read as real time,
    not taken out as a clock's error as on rank clocks)."""
    monkeypatch.setitem(globals(), "LOAD", 600_000 * NS)
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)
    write_run(tmp_path / "host", "1f1b", 8, profile=True, clocks="host")
    run = read_measured(tmp_path / "host")
    write_run(tmp_path / "rank", "1f1b", 8)
    assert run.one_clock and not read_measured(tmp_path / "rank").one_clock
    timeline = run.timeline
    sends = timeline[timeline["kind"].str.startswith("SEND")]
    recvs = timeline[timeline["kind"].str.startswith("RECV")]
    rows = transfer_rows(run)
    assert sorted(t.sent for t in rows) == sorted(sends["start"])
    assert sorted(t.reached for t in rows) == sorted(recvs["start"])
    assert sorted(t.received for t in rows) == sorted(recvs["end"])
    c = calibrate(run)
    assert c.p2p_latency == pytest.approx(LATENCY, rel=1e-6)
    assert c.p2p_load_latency == pytest.approx(600_000 * NS, rel=1e-6)
    skew = 2_000_000 * NS
    write_run(tmp_path / "late", "1f1b", 8, profile=True, clocks="host", skew=(skew,))
    # step 0's first (rank 0 -> 1) transfers, in step order: rank 1's RECVs end `skew` later
    late = [t for t in transfer_rows(read_measured(tmp_path / "late")) if t.sender == 0][:8]
    plain = [t for t in rows if t.sender == 0][:8]
    assert [t.received - t.sent for t in late] == pytest.approx([t.received - t.sent + skew for t in plain], abs=1e-12)


@pytest.mark.parametrize("name,chunks", [("1f1b", None), ("gpipe", None)])
def test_transfers_slowed_by_computing_ranks_are_recovered(tmp_path, monkeypatch, name, chunks):
    """A machine whose two ranks share one core and whose transfers take 600 us more per rank
    computing while they are on the wire (sim.engine.Wire), with the other rank's clock skewed
    each step: the calibration gives back the idle latency and the load term (its fit follows
    the law over the compute rows' pieces, k changing mid-transfer where the sender starts
    computing after its send overhead; the clocks are fitted with it), replays its run and
    predicts other schedules exactly, to the engine's whole-nanosecond rounding. The old model
    (one mean transfer time) cannot. With the cores unrecorded (a core per rank as far as the
    run says) the load term is not fitted: the mean, as before."""
    monkeypatch.setitem(globals(), "LOAD", 600_000 * NS)
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)  # a measured row ends at its action's end
    write_run(tmp_path / "skewed", name, 8, chunks, profile=True, skew=(2_000_000 * NS, -900_000 * NS, 0.0))
    skewed = calibrate(read_measured(tmp_path / "skewed"))
    assert skewed.p2p_latency == pytest.approx(LATENCY, rel=1e-6)
    assert skewed.p2p_load_latency == pytest.approx(600_000 * NS, rel=1e-6)
    # Compute under sharing is taken at full speed on the steps' raw clocks (full_speed), so
    # the replay is checked on a run whose clocks agree.
    write_run(tmp_path / "calib", name, 8, chunks, profile=True)
    run = read_measured(tmp_path / "calib")
    loads = [t.load for t in transfer_rows(run) if t.reached <= t.sent]
    assert max(loads) - min(loads) > 0.2  # the run holds transfers at several loads
    c = calibrate(run)
    assert c.p2p_latency == pytest.approx(LATENCY, rel=1e-6)
    assert c.p2p_load_latency == pytest.approx(600_000 * NS, rel=1e-6)
    comparison, _ = compare_run(run, c.for_run(run))
    assert abs(comparison.step_time_error) < 1e-6
    for other, m, k in (("gpipe", 4, None), ("zb-h1", 6, None), ("1f1b", 2, None)):
        truth = write_run(tmp_path / f"{other}-{m}", other, m, k)
        held_out = read_measured(tmp_path / f"{other}-{m}")
        assert simulate(held_out.program, c.for_run(held_out)).step_time == pytest.approx(truth, rel=1e-6)
    mean_only = dataclasses.replace(c, p2p_latency=transfer_time(transfer_rows(run)) - BOUNDARY / BANDWIDTH,
                                    p2p_load_latency=0.0)
    errors = [simulate(held_out.program, x.for_run(held_out)).step_time / truth - 1 for x in (c, mean_only)]
    assert abs(errors[0]) < 1e-6 < 1e-3 < abs(errors[1])  # the mean alone misses (transfers are short here)
    summary = json.loads((tmp_path / "calib" / "summary.json").read_text())
    del summary["cpu_cores"]
    (tmp_path / "calib" / "summary.json").write_text(json.dumps(summary))
    unshared = calibrate(read_measured(tmp_path / "calib"))
    assert unshared.p2p_load_latency == 0.0
    assert unshared.p2p_latency + BOUNDARY / BANDWIDTH == pytest.approx(
        transfer_time(transfer_rows(read_measured(tmp_path / "calib"), loads=False)), rel=1e-9)


@pytest.mark.parametrize("places", [{"F": (1.25, 1.05), "B": (0.8, 1.1)}, {"B": (0.7,)}])
def test_place_factors_recovered_and_carried_to_other_schedules(tmp_path, monkeypatch, places):
    """A machine whose first backward of a stage in a step is cheaper (it assigns the gradients)
    and whose first forwards are dearer: calibrating on its 1F1B run gives back the factors, the
    switch costs and the per-layer fits exactly, and predicts GPipe (whose phases repeat, so
    place and switch are told apart) and interleaved runs exactly."""
    monkeypatch.setitem(globals(), "PLACES", places)
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    c = calibrate(read_measured(tmp_path / "calib"))
    expected = {k: tuple(places.get(k, ())) + (1.0,) * (2 - len(places.get(k, ()))) for k in ("F", "B")}
    assert {k: tuple(v) for k, v in c.place_factors.items()} == {k: pytest.approx(v, rel=1e-9) for k, v in expected.items()}
    assert (c.switch_forward, c.switch_backward) == pytest.approx((SWITCH["F"], SWITCH["B"]), abs=1e-12)
    for kind in ("F", "B"):
        assert c.compute[kind].per_layer == pytest.approx(PER_LAYER[kind], rel=1e-9)
    assert_predicts(c, tmp_path, (("gpipe", 4, None), ("interleaved", 8, 2), ("1f1b", 2, None)), rel=1e-12)


def test_the_discount_of_a_long_run_of_repeats_is_told_by_a_gpipe_run(tmp_path, monkeypatch):
    """A machine whose k-th action of a run of repeats costs its stage cost times
    1 - d (1 - 1/(k-1)) from k=3, d = 0.35 for F and 0.2 for B (off the search's grid). A 1F1B
    run at p=2 cannot tell it (its runs of repeats are 2 long at most): calibrated alone, both
    discounts are 0 and the report says so. With a GPipe run at m=8 beside it (runs of 8), the
    discounts, the switches and the per-layer costs come back, and GPipe at m=16 (runs of 16),
    interleaved at m=8 (half-size stages) and 1F1B at m=4 are predicted exactly; the 1F1B run
    alone predicts GPipe at m=16 over 5% long."""
    monkeypatch.setitem(globals(), "DISCOUNT", {"F": 0.35, "B": 0.2})
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    write_run(tmp_path / "gpipe", "gpipe", 8, profile=True)
    alone = calibrate(read_measured(tmp_path / "calib"))
    assert (alone.repeat_discount_forward, alone.repeat_discount_backward) == (0.0, 0.0)
    assert "not told" in alone.report()
    c = calibrate_runs([read_measured(tmp_path / "calib"), read_measured(tmp_path / "gpipe")])
    assert (c.repeat_discount_forward, c.repeat_discount_backward) == pytest.approx((0.35, 0.2), abs=1e-6)
    assert (c.switch_forward, c.switch_backward) == pytest.approx((SWITCH["F"], SWITCH["B"]), rel=1e-6)
    for kind in ("F", "B"):
        assert c.compute[kind].per_layer == pytest.approx(PER_LAYER[kind], rel=1e-6)
    assert_predicts(c, tmp_path, (("gpipe", 16, None), ("interleaved", 8, 2), ("1f1b", 4, None)), rel=1e-7)
    gpipe = schedules.build("gpipe", ranks=2, microbatches=16)
    assert simulate(gpipe, alone.cost_model(2)).step_time / write_run(tmp_path / "again", "gpipe", 16) - 1 > 0.05


def test_where_ranks_share_cores_the_discount_is_told_by_thread_cpu_time(tmp_path, monkeypatch):
    """The machine of the test above with both ranks on one core: the discount is read from each
    action's thread CPU time (cpu.csv), not from durations taken through the sharing model, and
    comes back; a run without cpu.csv tells none."""
    monkeypatch.setitem(globals(), "DISCOUNT", {"F": 0.35, "B": 0.2})
    monkeypatch.setitem(globals(), "CORES", 1)
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    write_run(tmp_path / "gpipe", "gpipe", 8, profile=True)
    runs = [read_measured(tmp_path / "calib"), read_measured(tmp_path / "gpipe")]
    c = calibrate_runs(runs, idle_share=0.0)
    assert (c.repeat_discount_forward, c.repeat_discount_backward) == pytest.approx((0.35, 0.2), abs=1e-6)
    (tmp_path / "gpipe" / "cpu.csv").unlink()
    bare = calibrate_runs([read_measured(tmp_path / "calib"), read_measured(tmp_path / "gpipe")], idle_share=0.0)
    assert (bare.repeat_discount_forward, bare.repeat_discount_backward) == (0.0, 0.0)


def latest_start(run) -> float:
    """The run's latest compute start into a step (its steps are alike)."""
    return float(run.timeline[run.timeline["kind"].isin(["F", "B"])]["start"].max())


def test_compute_that_grows_into_the_step_is_recovered_where_ranks_share_cores(tmp_path, monkeypatch):
    """Two ranks on one core whose compute actions cost 1 + 0.5/s x (their start into the step)
    times their price (up to 10 s: no cap inside a step). The rate comes back from the actions'
    thread CPU time, with the horizon at the latest start the run holds, the per-layer costs with
    it; the run replays itself, a 1F1B run at m=4 (every start within the horizon) is predicted
    exactly, and a GPipe run at m=16, longer, exactly as a machine whose growth stops at the
    horizon (the law is not extrapolated). The same runs without growth fit none."""
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)  # a measured row ends at its action's end
    monkeypatch.setitem(globals(), "GROWTH", (0.5, 10.0))
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    run = read_measured(tmp_path / "calib")
    c = calibrate_runs([run], idle_share=0.0)
    assert c.compute_growth == pytest.approx(0.5, rel=1e-6)
    assert c.growth_horizon == pytest.approx(latest_start(run), rel=1e-12)
    assert c.diagnostics["compute_growth_fit"]["kept"]
    assert "compute grows into the step: x(1 + 0.5/s" in c.report()
    for kind in ("F", "B"):
        assert c.compute[kind].per_layer == pytest.approx(PER_LAYER[kind], rel=1e-5)
    comparison, _ = compare_run(run, c.for_run(run))
    assert abs(comparison.step_time_error) < 1e-6
    truth = write_run(tmp_path / "short", "1f1b", 4)
    short = read_measured(tmp_path / "short")
    assert latest_start(short) < c.growth_horizon
    assert simulate(short.program, c.for_run(short)).step_time == pytest.approx(truth, rel=1e-6)
    plain = dataclasses.replace(c, compute_growth=0.0)  # the same prices without the law: short
    assert simulate(short.program, plain.for_run(short)).step_time < truth * 0.97
    monkeypatch.setitem(globals(), "GROWTH", (0.5, c.growth_horizon))
    truth = write_run(tmp_path / "long", "gpipe", 16)
    long = read_measured(tmp_path / "long")
    assert latest_start(long) > c.growth_horizon * 1.2
    assert simulate(long.program, c.for_run(long)).step_time == pytest.approx(truth, rel=1e-6)
    monkeypatch.setitem(globals(), "GROWTH", (0.0, 0.0))
    write_run(tmp_path / "flat", "1f1b", 8, profile=True)
    flat = calibrate_runs([read_measured(tmp_path / "flat")], idle_share=0.0)
    assert flat.compute_growth == 0.0 and not flat.diagnostics["compute_growth_fit"]["kept"]


def test_growth_is_told_only_by_thread_cpu_where_ranks_share_cores(tmp_path, monkeypatch):
    """The machine above: a run on cores of its own, or without cpu.csv, tells no growth (the
    law is fitted only where ranks shared cores, README "Dearer the longer the step"): the
    calibration has none and no fit in its diagnostics."""
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)
    monkeypatch.setitem(globals(), "GROWTH", (0.5, 10.0))
    write_run(tmp_path / "own", "1f1b", 8, profile=True)
    own = calibrate_runs([read_measured(tmp_path / "own")])
    assert own.compute_growth == 0.0 and "compute_growth_fit" not in own.diagnostics
    monkeypatch.setitem(globals(), "CORES", 1)
    write_run(tmp_path / "bare", "1f1b", 8, profile=True)
    (tmp_path / "bare" / "cpu.csv").unlink()
    bare = calibrate_runs([read_measured(tmp_path / "bare")], idle_share=0.0)
    assert bare.compute_growth == 0.0 and "compute_growth_fit" not in bare.diagnostics


def test_the_report_says_why_no_growth_was_kept(calibration_run):
    """A growth fit that stood within its noise, and one with nothing to tell, each get their line."""
    c = calibrate(read_measured(calibration_run))
    weak = {"actions": 900, "rate": 0.4, "standard_error": 0.2, "kept": False}
    assert "not kept: 0.4/s over 900 actions, within 3 standard errors (0.2/s)" in dataclasses.replace(
        c, diagnostics={"compute_growth_fit": weak}).report()
    mute = {"actions": 3, "rate": None, "standard_error": None, "kept": False}
    assert "not told: 3 actions" in dataclasses.replace(c, diagnostics={"compute_growth_fit": mute}).report()
    assert "compute grow" not in c.report()  # ranks on cores of their own: no fit at all


def test_a_slow_step_is_not_read_as_growth(tmp_path, monkeypatch):
    """A machine without growth whose second step ran 1.5 times slower (its actions dearer and
    so later): within each step every action costs the same, so the fit, which gives each step
    its own level, finds no growth; pooling the steps, as a fit without that level would, reads a
    clear rise from the same actions."""
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)
    write_run(tmp_path / "calib", "1f1b", 8, stalls={1: 1.5})
    run = read_measured(tmp_path / "calib")
    growth, told = calibration_module.fit_growth([run], [0.0])
    assert growth == calibration_module.Growth() and told["rate"] == pytest.approx(0.0, abs=1e-9)
    rows = calibration_module.growth_rows(run, 0.0)
    level = rows["cost"] / rows.groupby(["rank", "stage", "kind"])["cost"].transform("mean")
    assert np.polyfit(rows["start"], level, 1)[0] > 0.5


def test_ranks_sharing_one_core_are_calibrated_at_full_speed(tmp_path, monkeypatch):
    """Both ranks of a machine with one core: every action that overlaps the other rank's runs
    slower. The calibration takes each action's time on a processor of its own (the integral
    of min(1, cores / ranks computing)), so it gives back the machine's per-layer and fixed
    costs, replays its run and predicts GPipe under sharing (to the engine's whole-ns rounding);
    with the cores unrecorded it would fit the slowed times."""
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)  # a measured row ends at its action's end
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    run = read_measured(tmp_path / "calib")
    c = calibrate(run)
    for kind in ("F", "B"):
        assert c.compute[kind].per_layer == pytest.approx(PER_LAYER[kind], rel=1e-6)
        for role, value in FIXED[kind].items():
            assert c.compute[kind].fixed[role] == pytest.approx(value + SWITCH[kind], rel=1e-5)
    assert c.for_run(run).cores == 1
    comparison, _ = compare_run(run, c.for_run(run))
    assert abs(comparison.step_time_error) < 1e-6
    truth = write_run(tmp_path / "gpipe", "gpipe", 4)
    held_out = read_measured(tmp_path / "gpipe")
    assert simulate(held_out.program, c.for_run(held_out)).step_time == pytest.approx(truth, rel=1e-6)
    summary = json.loads((tmp_path / "calib" / "summary.json").read_text())
    del summary["cpu_cores"]
    (tmp_path / "calib" / "summary.json").write_text(json.dumps(summary))
    slowed = calibrate(read_measured(tmp_path / "calib"))
    assert all(a["B"] > b["B"] * 1.01 for a, b in zip(slowed.stages, c.stages))


@pytest.mark.parametrize("idle", [0.6, 1.0])
def test_idle_ranks_share_of_a_core_is_recovered(tmp_path, monkeypatch, idle):
    """Two ranks on one core where a rank that is not computing still takes `idle` of it (the
    executor's own work, receives that poll): an action alone runs at 1 / (1 + idle) of its
    speed. The calibration finds the share (of IDLE_SHARES, the one under which each cell's
    actions are alike on a core of their own), gives back the per-layer and fixed costs, replays
    its run and predicts GPipe and interleaved runs under the same sharing; processor sharing
    among compute alone (share 0) fits the slowed times and misses them."""
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "IDLE", idle)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)  # a measured row ends at its action's end
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    run = read_measured(tmp_path / "calib")
    assert fit_idle_share(run) == idle
    c = calibrate(run)
    assert c.idle_share == idle and c.for_run(run).idle_share == idle
    for kind in ("F", "B"):
        assert c.compute[kind].per_layer == pytest.approx(PER_LAYER[kind], rel=1e-6)
    comparison, _ = compare_run(run, c.for_run(run))
    assert abs(comparison.step_time_error) < 1e-6
    for name, m, chunks in (("gpipe", 4, None), ("interleaved", 8, 2)):
        truth = write_run(tmp_path / f"{name}-{m}", name, m, chunks)
        held_out = read_measured(tmp_path / f"{name}-{m}")
        assert simulate(held_out.program, c.for_run(held_out)).step_time == pytest.approx(truth, rel=1e-6)
        unshared = dataclasses.replace(c.for_run(held_out), idle_share=0.0)
        assert abs(simulate(held_out.program, unshared).step_time / truth - 1) > 0.05
    assert Calibration.from_dict(json.loads(json.dumps(c.to_dict()))).idle_share == idle
    # Several runs: one share over all their cells, which predicts a third schedule exactly.
    write_run(tmp_path / "calib-interleaved", "interleaved", 8, 2, profile=True)
    both = calibrate_runs([run, read_measured(tmp_path / "calib-interleaved")])
    assert both.idle_share == idle
    truth = write_run(tmp_path / "zb-h1", "zb-h1", 6)
    held_out = read_measured(tmp_path / "zb-h1")
    assert simulate(held_out.program, both.for_run(held_out)).step_time == pytest.approx(truth, rel=1e-6)


@pytest.mark.parametrize("idle", [0.35, 0.6])
def test_idle_share_chosen_by_the_runs_step_times(tmp_path, monkeypatch, idle):
    """The share chosen by replay (sim.share_choice) does not rest on the cells' criterion:
    with that criterion made to answer 0 (as noisy actions can make it), the calibration of a
    1F1B and an interleaved run at 0 cannot replay both, while the choice by step times gives
    the machine's share back exactly (reached from the coarse grid through its refinements),
    replays both runs and predicts GPipe and ZB-H1 runs exactly, and records every
    candidate's error, the chosen one 0 and the others not."""
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "IDLE", idle)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    write_run(tmp_path / "calib-interleaved", "interleaved", 8, 2, profile=True)
    runs = [read_measured(tmp_path / "calib"), read_measured(tmp_path / "calib-interleaved")]
    monkeypatch.setattr(calibration_module, "fit_idle_share", lambda *runs: 0.0)
    assert share_choice.replay_error(calibrate_runs(runs, idle_share=0.0).for_run, runs) > 0.002
    c = calibrate_runs(runs)
    assert c.idle_share == idle
    choice = c.diagnostics["idle_share_choice"]
    assert choice["share"] == idle and choice["cells_share"] == 0.0
    errors = {float(s): e for s, e in choice["replay_error"].items()}
    assert errors[idle] < 1e-6 and all(e > 1e-3 for s, e in errors.items() if s != idle)
    assert len(errors) <= len(share_choice.COARSE) + 2
    for run in runs:
        assert simulate(run.program, c.for_run(run)).step_time == pytest.approx(run.step_time_median, rel=1e-6)
    for name, m, chunks in (("gpipe", 4, None), ("zb-h1", 6, None)):
        truth = write_run(tmp_path / f"{name}-{m}", name, m, chunks)
        held_out = read_measured(tmp_path / f"{name}-{m}")
        assert simulate(held_out.program, c.for_run(held_out)).step_time == pytest.approx(truth, rel=1e-6)


def test_one_program_is_chosen_for_by_its_own_step_time(tmp_path, monkeypatch):
    """A single program's replay tells shares apart only weakly (sim.share_choice's docstring:
    under 0.1% at 0 for this noise-free run), but exactly only at the machine's share: with
    the cells' criterion made to answer 0, the choice still gives 0.6 back and replays the run
    exactly; the whole coarse grid is scanned."""
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "IDLE", 0.6)
    monkeypatch.setitem(globals(), "DISPATCH", 0.0)
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    run = read_measured(tmp_path / "calib")
    monkeypatch.setattr(calibration_module, "fit_idle_share", lambda *runs: 0.0)
    assert 0 < share_choice.replay_error(calibrate_runs([run], idle_share=0.0).for_run, [run]) < 1e-3
    chosen = calibrate_runs([run])
    assert chosen.idle_share == 0.6
    tried = {float(s) for s in chosen.diagnostics["idle_share_choice"]["replay_error"]}
    assert set(share_choice.COARSE) <= tried
    assert simulate(run.program, chosen.for_run(run)).step_time == pytest.approx(run.step_time_median, rel=1e-6)


def test_share_choice_leaves_runs_on_cores_of_their_own_alone(calibration_run, tmp_path):
    """Where no run's ranks shared cores the share plays no part: no candidate is tried, and
    the calibration is the one at any share."""
    write_run(tmp_path / "interleaved", "interleaved", 8, 2, profile=True)
    runs = [read_measured(calibration_run), read_measured(tmp_path / "interleaved")]
    chosen = calibrate_runs(runs)
    assert "idle_share_choice" not in chosen.diagnostics and chosen.idle_share == 0.0
    assert chosen.to_dict() == {**calibrate_runs(runs, idle_share=0.7).to_dict(), "idle_share": 0.0}


def test_calibration_at_a_given_share_equals_the_chosen_one(tmp_path, monkeypatch):
    """calibrate_runs with idle_share given is the calibration the choice makes when it
    chooses the same share, but for the choice's record: the transfers' fit (TransferFits)
    made once and reused for every candidate changes nothing."""
    monkeypatch.setitem(globals(), "CORES", 1)
    monkeypatch.setitem(globals(), "IDLE", 0.6)
    write_run(tmp_path / "calib", "1f1b", 8, profile=True)
    run = read_measured(tmp_path / "calib")
    chosen = calibrate_runs([run])
    assert chosen.idle_share == 0.6
    without_record = {k: v for k, v in chosen.diagnostics.items() if k != "idle_share_choice"}
    assert calibrate_runs([run], idle_share=0.6).to_dict() == {**chosen.to_dict(), "diagnostics": without_record}
    assert calibrate_runs([run], idle_share=0.2).idle_share == 0.2


def test_posting_cost_of_a_ranks_first_receives_is_recovered(tmp_path, monkeypatch):
    """Whole-step posting at 40 us a receive: a rank starts its stream that much later per
    receive of its step (1F1B at p=2, m=4: 4 on each rank; interleaved v=2: 12). The two runs
    together give back the cost and the step overhead exactly, replay both and predict GPipe
    and 1F1B at other m. One 1F1B run alone posts as many on each rank, so it cannot tell the
    cost from the overhead: it fits none, replays itself, and predicts 1F1B at m=12 short by
    exactly the 8 receives more that each rank posts there."""
    monkeypatch.setitem(globals(), "POST", 40_000 * NS)
    monkeypatch.setitem(globals(), "POST_AHEAD", "step")
    write_run(tmp_path / "1f1b", "1f1b", 4, profile=True)
    write_run(tmp_path / "interleaved", "interleaved", 4, 2, profile=True)
    runs = [read_measured(tmp_path / name) for name in ("1f1b", "interleaved")]
    both = calibrate_runs(runs)
    assert both.post_overhead == pytest.approx(POST, abs=1e-12)
    assert both.step_overhead == pytest.approx(STEP, abs=1e-12)
    for run in runs:
        assert abs(compare_run(run, both.for_run(run))[0].step_time_error) < 1e-9
    for name, m in (("gpipe", 6), ("1f1b", 12)):
        truth = write_run(tmp_path / f"{name}-{m}", name, m)
        held_out = read_measured(tmp_path / f"{name}-{m}")
        assert simulate(held_out.program, both.for_run(held_out)).step_time == pytest.approx(truth, rel=1e-9)
    alone = calibrate(runs[0])
    assert alone.post_overhead == 0.0 and alone.step_overhead == pytest.approx(STEP + 4 * POST, abs=1e-12)
    assert abs(compare_run(runs[0], alone.for_run(runs[0]))[0].step_time_error) < 1e-9
    held_out = read_measured(tmp_path / "1f1b-12")
    short = simulate(held_out.program, alone.for_run(held_out)).step_time
    assert held_out.step_time_median - short == pytest.approx(8 * POST, abs=1e-9)
    assert Calibration.from_dict(json.loads(json.dumps(both.to_dict()))).post_overhead == both.post_overhead


@pytest.mark.parametrize("name,m,chunks", [("gpipe", 4, None), ("1f1b", 16, None), ("interleaved", 8, 2),
                                           ("interleaved", 4, 4)])
def test_calibration_predicts_other_schedules_and_chunk_counts(calibration_run, tmp_path, name, m, chunks):
    c = calibrate(read_measured(calibration_run))
    truth = write_run(tmp_path / "held-out", name, m, chunks)
    schedule = schedules.build(name, ranks=2, microbatches=m, chunks=chunks)
    predicted = simulate(schedule, c.cost_model(schedule.num_stages)).step_time
    assert predicted == pytest.approx(truth, rel=1e-12)
    comparison, _ = compare_run(read_measured(tmp_path / "held-out"), c.for_run(read_measured(tmp_path / "held-out")))
    assert comparison.start_mae == 0.0
    assert comparison.peak_activation_bytes_simulated == comparison.peak_activation_bytes_measured


def test_calibration_json_round_trip(calibration_run, tmp_path):
    c = calibrate(read_measured(calibration_run))
    c.to_json(tmp_path / "costs.json")
    again = load_costs(tmp_path / "costs.json")
    assert isinstance(again, Calibration)
    assert again.cost_model(4) == c.cost_model(4)
    CostModel(forward=1.0, backward_input=2.0).to_json(tmp_path / "plain.json")
    assert load_costs(tmp_path / "plain.json") == CostModel(forward=1.0, backward_input=2.0)


def test_without_profile_only_the_runs_own_stages(tmp_path):
    write_run(tmp_path / "run", "1f1b", 4)
    run = read_measured(tmp_path / "run")
    c = calibrate(run)
    assert c.compute is None
    comparison, _ = compare_run(run, c.for_run(run))
    assert abs(comparison.step_time_error) < 1e-12
    with pytest.raises(CostError, match="no per-layer profile"):
        c.cost_model(4)


def test_calibration_refuses_another_microbatch_size(calibration_run, tmp_path):
    c = calibrate(read_measured(calibration_run))
    write_run(tmp_path / "run", "gpipe", 4)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["microbatch_sizes"] = [ROWS * 2] * 4
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(CostError, match="samples per microbatch"):
        c.for_run(read_measured(tmp_path / "run"))


# ------------------------------------------------------------------ command line
def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_calibrate_then_compare_measured_cli(calibration_run, tmp_path, capsys):
    costs = tmp_path / "costs.json"
    code, out, err = run_cli(capsys, "calibrate", calibration_run, "-o", costs)
    assert code == 0, err
    assert "per layer" in out and costs.is_file()
    write_run(tmp_path / "held-out", "interleaved", 4, chunks=2)
    overlay = tmp_path / "overlay.png"
    code, out, err = run_cli(capsys, "compare", "--measured", tmp_path / "held-out", "--costs", costs, "--json",
                             "--overlay", overlay)
    assert code == 0, err
    record = json.loads(out)
    keys = {"makespan_measured", "makespan_simulated", "makespan_error", "start_mae", "bubble_ratio_measured",
            "bubble_ratio_simulated", "peak_activation_bytes_measured", "peak_activation_bytes_simulated"}
    assert keys <= set(record)
    assert record["start_mae"] == 0.0 and abs(record["step_time_error"]) < 1e-12
    assert len(record["peak_activation_bytes_measured"]) == 2
    assert overlay.stat().st_size > 0
    code, out, err = run_cli(capsys, "compare", "--measured", tmp_path / "held-out")
    assert code == 0 and "calibrated from this run" in out


def broken(tmp_path: Path, source: Path, how: str) -> Path:
    """A copy of `source` damaged one way."""
    path = tmp_path / how
    shutil.copytree(source, path)
    if how == "no-program":
        (path / "program.json").unlink()
    elif how == "truncated-timeline":
        text = (path / "timeline.csv").read_text().splitlines()
        (path / "timeline.csv").write_text("\n".join(text[: len(text) - 7]) + "\n")
    elif how == "truncated-summary":
        text = (path / "summary.json").read_text()
        (path / "summary.json").write_text(text[: len(text) // 2])
    elif how == "fewer-step-times":
        summary = json.loads((path / "summary.json").read_text())
        summary["step_times"] = summary["step_times"][:-1]
        (path / "summary.json").write_text(json.dumps(summary))
    elif how == "bad-time":
        text = (path / "timeline.csv").read_text().splitlines()
        cells = text[5].split(",")
        cells[7] = "nan"
        text[5] = ",".join(cells)
        (path / "timeline.csv").write_text("\n".join(text) + "\n")
    elif how == "bad-profile":
        (path / "profile.json").write_text(json.dumps({"layers": {"rows": ROWS, "records": [{"role": "top"}]}}))
    elif how == "bad-byte-count":
        profile = json.loads((path / "profile.json").read_text())
        profile["layers"]["records"][0]["input_bytes"] = "16 KiB"
        (path / "profile.json").write_text(json.dumps(profile))
    elif how == "bad-post-ahead":
        summary = json.loads((path / "summary.json").read_text())
        summary["post_ahead"] = "soon"
        (path / "summary.json").write_text(json.dumps(summary))
    elif how == "no-layer-ranges":
        summary = json.loads((path / "summary.json").read_text())
        del summary["stage_costs"][0]["layers"]
        (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.mark.parametrize("how,message", [
    ("missing", "does not exist"),
    ("no-program", "lacks program.json"),
    ("truncated-timeline", "truncated"),
    ("truncated-summary", "not valid JSON"),
    ("fewer-step-times", "truncated"),
    ("bad-time", "not a finite number"),
    ("bad-profile", "malformed"),
    ("bad-byte-count", "layers.records"),
    ("no-layer-ranges", "layer range"),
    ("bad-post-ahead", "post_ahead"),
])
def test_broken_run_directories_get_one_line_errors(calibration_run, tmp_path, capsys, how, message):
    path = tmp_path / "missing" if how == "missing" else broken(tmp_path, calibration_run, how)
    with pytest.raises(ScheduleError, match=message):
        read_measured(path)
    for argv in (("calibrate", path, "-o", tmp_path / "c.json"), ("compare", "--measured", path)):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and message.split()[0] in err, err


@pytest.mark.parametrize("flags,message", [
    (("--schedules", "gpipe"), "drop --schedules"),
    (("--forward", "1"), "drop --forward"),
    (("--csv",), "not --csv"),
])
def test_compare_measured_rejects_flags_that_do_not_apply(calibration_run, capsys, flags, message):
    code, out, err = run_cli(capsys, "compare", "--measured", calibration_run, *flags)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_compare_measured_with_a_calibration_of_another_model(calibration_run, tmp_path, capsys):
    costs = tmp_path / "costs.json"
    calibrate(read_measured(calibration_run)).to_json(costs)
    data = json.loads(costs.read_text())
    data["model"]["hidden"] = 128
    costs.write_text(json.dumps(data))
    code, _, err = run_cli(capsys, "compare", "--measured", calibration_run, "--costs", costs)
    assert code == 2 and "calibration is for" in err


def test_cost_model_overheads_are_validated():
    for name in ("send_overhead", "wake_overhead", "recv_overhead", "step_overhead"):
        with pytest.raises(CostError, match=name):
            CostModel(forward=1.0, backward_input=1.0, **{name: -1.0})
    assert not math.isnan(CostModel(forward=1.0, backward_input=1.0, step_overhead=0.5).step_overhead)


def test_compare_predicts_from_a_calibration_file(calibration_run, tmp_path, capsys):
    costs = tmp_path / "costs.json"
    calibrate(read_measured(calibration_run)).to_json(costs)
    code, out, err = run_cli(capsys, "compare", "--costs", costs, "--schedules", "gpipe,interleaved", "--ranks", "2",
                             "--microbatches", "4", "--json")
    assert code == 0, err
    by_name = {r["schedule"]: r for r in json.loads(out)}
    for name, chunks in (("gpipe", None), ("interleaved", 2)):
        truth = write_run(tmp_path / name, name, 4, chunks)
        assert by_name[name]["step_time"] == pytest.approx(truth, rel=1e-12)
    code, _, err = run_cli(capsys, "compare", "--costs", costs, "--forward", "1")
    assert code == 2 and "is a calibration" in err


def test_posted_before_places_receives_like_the_executor():
    """runtime/executor.py posts a RECV's receive just before the compute action that lies
    post_ahead compute actions before the RECV (worked by hand for 1F1B, p=2, m=2)."""
    from schedules.posting import PostAhead, posted_before, posted_first

    program = schedules.lower(schedules.build("1f1b", ranks=2, microbatches=2))
    rank1 = program.streams[1]
    assert [str(a) for a in rank1] == ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]
    # k=1: 1RECV_F0 has no compute before it (posted before the first action); 1RECV_F1 has
    # F0 and B0 before it, so it is posted one compute earlier than F1: before B0.
    assert posted_before(rank1, PostAhead(1)) == [1, 0, 1, 0, 0, 0, 0, 0]
    # k=2: 1RECV_F1 goes before F0; with 0 every receive is posted inside its RECV.
    assert posted_before(rank1, PostAhead(2)) == [1, 1, 0, 0, 0, 0, 0, 0]
    # "step": every receive of the step before the first action.
    assert posted_before(rank1, PostAhead.step()) == [2, 0, 0, 0, 0, 0, 0, 0]
    assert posted_before(rank1, PostAhead(0)) == [0] * 8
    # what the rank posts before it starts its stream (the simulator's late start)
    assert [posted_first(rank1, a) for a in (PostAhead(0), PostAhead(1), PostAhead(2), PostAhead.step())] == [0, 1, 1, 2]
    assert posted_first((), PostAhead.step()) == 0


def test_sweep_predicts_from_a_calibration_file(calibration_run, tmp_path, capsys):
    """`sim sweep --costs CALIBRATION`: each configuration gets the cost model of its own
    stages, so every row equals that schedule's synthetic (true) run; a stage count the
    model's 8 layers cannot fill is skipped with the calibration's reason."""
    import pandas as pd

    costs = tmp_path / "costs.json"
    calibrate(read_measured(calibration_run)).to_json(costs)
    out = tmp_path / "sweep.csv"
    code, _, err = run_cli(capsys, "sweep", "--costs", costs, "--schedules", "gpipe,interleaved", "--ranks", "2",
                           "--microbatches", "2,4", "--chunks", "2,8", "--out", out, "--no-progress")
    assert code == 0, err
    table = pd.read_csv(out)
    assert len(table) == 4  # gpipe m=2,4 and interleaved v=2 m=2,4; v=8 would need 16 stages
    assert "skipped 2 of 6" in err and "fewer than the program's 16 stages" in err
    for row in table.itertuples():
        chunks = None if row.schedule == "gpipe" else int(row.chunks)
        schedule = schedules.build(row.schedule, ranks=2, microbatches=int(row.microbatches), chunks=chunks)
        truth = simulate(schedule, true_costs(schedule.num_stages))
        assert row.makespan == pytest.approx(truth.makespan, rel=1e-12)
    code, _, err = run_cli(capsys, "sweep", "--costs", costs, "--comm-latency", "1")
    assert code == 2 and "is a calibration" in err


def test_plot_overlay_calibrates_from_the_run_and_plots_take_calibrations(calibration_run, tmp_path, capsys):
    """`sim plot --run DIR --overlay` without cost flags simulates the run under a calibration
    from the run itself (its replay equals the synthetic run); --costs may be a calibration
    for overlays and for plots of named schedules."""
    from sim.measured import read_run
    from sim.sources import CostOverrides, run_costs

    run = read_measured(calibration_run)
    replay = simulate(run.program, run_costs(None, CostOverrides(), read_run(calibration_run)))
    assert replay.makespan == pytest.approx(simulate(run.program, true_costs(2)).makespan, rel=1e-12)
    flagged = run_costs(None, CostOverrides(forward=3.0), read_run(calibration_run))
    assert flagged.forward == 3.0  # a cost flag means: these costs, not a calibration
    costs = tmp_path / "costs.json"
    calibrate(run).to_json(costs)
    png = tmp_path / "p.png"
    for argv in (["--run", calibration_run, "--overlay"], ["--run", calibration_run, "--overlay", "--costs", costs],
                 ["--compare", "gpipe,interleaved", "--ranks", "2", "--microbatches", "4", "--costs", costs],
                 ["--schedule", "1f1b", "--ranks", "2", "--microbatches", "4", "--costs", costs]):
        code, _, err = run_cli(capsys, "plot", *argv, "-o", png)
        assert code == 0, (argv, err)
        assert png.read_bytes()[:4] == b"\x89PNG"
        png.unlink()


def _cells(stage, place, switching, value, weight):
    from sim.calibration import Cells

    return Cells(np.array(stage), np.array(place), np.where(np.array(switching, dtype=bool), 1, 2), np.array(value, dtype=float),
                 np.array(weight, dtype=float))


def test_a_switch_seen_at_one_stage_and_place_is_recovered_where_almost_every_action_switches():
    """ZB-H1's W at p=2, m=4: every W switches but one (stage 1, later places); values made
    from c x f + switch come back exactly."""
    from sim.calibration import fit_cells

    ms = 1e-3
    c, f, switch = {0: 0.4 * ms, 1: 0.5 * ms}, (1.3, 1.1, 1.0), 0.05 * ms
    keys = [(0, 0, True), (0, 1, True), (0, 2, True), (1, 0, True), (1, 1, True), (1, 2, False), (1, 2, True)]
    weight = [1, 1, 2, 1, 1, 1, 1]
    value = [c[s] * f[q] + switch * on for s, q, on in keys]
    fit = fit_cells(_cells(*zip(*keys), value, weight), 2)
    assert fit.switch == pytest.approx(switch, rel=1e-9)
    assert fit.factors == pytest.approx(f, rel=1e-9)
    assert fit.stage_cost == {k: pytest.approx(v, rel=1e-9) for k, v in c.items()}


def test_cells_that_disagree_give_the_observed_switch_and_positive_costs():
    """The W cells of a measured ZB-H1 run (mlp 8 layers hidden 512, 2 rows, p=2, m=4,
    runs/fidelity/mlp-2-p2/calibrate-zb-h1, ms): stage 0's first W cheaper than its later
    ones, stage 1's dearer, so no place factor fits both. Fitted jointly, the switch took
    0.59 ms, c went negative and f to x8.1 and x0.08 (the run replayed 57% long); the
    switch is the one contrast the run holds (0.423 - 0.363 ms), and each stage's
    modelled W time per step stays within 10% of what it measured."""
    from sim.calibration import fit_cells

    ms = 1e-3
    keys = [(0, 0, True), (0, 1, True), (0, 2, True), (1, 0, True), (1, 1, True), (1, 2, False), (1, 2, True)]
    value = [v * ms for v in (0.295, 0.658, 0.642, 1.152, 0.632, 0.363, 0.423)]
    weight = [1, 1, 2, 1, 1, 1, 1]
    cells = _cells(*zip(*keys), value, weight)
    fit = fit_cells(cells, 2)
    assert fit.switch == pytest.approx(0.060 * ms, rel=1e-9)
    assert all(v > 0 for v in fit.stage_cost.values())
    model = [fit.stage_cost[s] * fit.factors[q] + fit.switch * on for s, q, on in keys]
    for stage in (0, 1):
        measured = sum(w * v for (s, _, _), w, v in zip(keys, weight, value) if s == stage)
        modelled = sum(w * v for (s, _, _), w, v in zip(keys, weight, model) if s == stage)
        assert modelled == pytest.approx(measured, rel=0.10)


def test_compute_level_of_a_run_on_a_slower_machine(calibration_run, tmp_path, monkeypatch):
    """A held-out run made by a machine whose every compute cost is 1.25x the calibrated one
    (transfers and overheads unchanged): the comparison's compute level is exactly 1.25 and, at
    that level, the prediction is exact; the calibration run itself is at level 1."""
    run = read_measured(calibration_run)
    calibration = calibrate(run)
    comparison, _ = compare_run(run, calibration.for_run(run), calibration.dispatch_overhead)
    assert comparison.compute_level == pytest.approx(1.0, rel=1e-9)
    assert comparison.step_time_error_at_run_level == pytest.approx(0.0, abs=1e-9)
    truth = true_costs
    monkeypatch.setattr(sys.modules[__name__], "true_costs", lambda n: truth(n).compute_scaled(1.25))
    write_run(tmp_path / "slower", "interleaved", 4, chunks=2)
    slower = read_measured(tmp_path / "slower")
    comparison, _ = compare_run(slower, calibration.for_run(slower), calibration.dispatch_overhead)
    assert comparison.step_time_error < -0.05  # at the calibrated speed the prediction is short
    assert comparison.compute_level == pytest.approx(1.25, rel=1e-9)
    assert comparison.compute_measured == pytest.approx(1.25 * comparison.compute_simulated, rel=1e-9)
    assert comparison.step_time_error_at_run_level == pytest.approx(0.0, abs=1e-9)
    record = comparison.to_dict()
    assert record["compute_level"] == pytest.approx(1.25) and json.dumps(record)
    from sim.quality import quality_of

    quality = quality_of(calibration, [run, slower])
    assert [e["compute_level"] for e in quality["runs"]] == pytest.approx([1.0, 1.25], rel=1e-9)
    assert any("x1.000 to x1.250 of the fitted costs" in w for w in quality["warnings"])


@pytest.mark.parametrize("one_way", [False, True])
def test_a_split_forward_is_priced_apart(tmp_path, monkeypatch, one_way):
    """A machine whose F costs 0.3 ms per layer more when its backward is split into I and W (the
    executor's bridges, runtime.split). With profiles that time both ways, a 1F1B run alone gives
    the split forward, I and W at the machine's cost (the profile's, at the run's speed ratios) and
    predicts ZB-H2 and ZBV exactly (and a ZB-H1 run alone prices F and B); with profiles of the run's way only (as before), it cannot
    and predicts ZB-H2 short, while a 1F1B and a ZB-H1 run together still tell the plain and the
    split forward apart. Either way the pair replays itself, prices every stage of other cuts as
    the machine does, and predicts held-out runs of either kind (GPipe, ZB-H2, ZBV) exactly."""
    monkeypatch.setitem(globals(), "SPLIT_PER_LAYER", 300_000 * NS)
    write_run(tmp_path / "1f1b", "1f1b", 8, profile=True, one_way=one_way)
    write_run(tmp_path / "zb-h1", "zb-h1", 8, profile=True, one_way=one_way)
    runs = [read_measured(tmp_path / name) for name in ("1f1b", "zb-h1")]
    held_out = {}
    for name, m in (("gpipe", 4), ("zb-h2", 6), ("zbv", 4)):
        truth = write_run(tmp_path / f"{name}-{m}", name, m)
        held_out[name] = (read_measured(tmp_path / f"{name}-{m}"), truth)
    both = calibrate_runs(runs)
    for n in (2, 4):
        truth, fitted = true_costs(n), both.cost_model(n)
        assert fitted.forward == pytest.approx(truth.forward, rel=1e-6)
        assert fitted.forward_split == pytest.approx(truth.forward_split, rel=1e-6)
        assert fitted.forward_split[0] > fitted.forward[0] * 1.05
    for run in runs:
        assert abs(compare_run(run, both.for_run(run))[0].step_time_error) < 1e-6
    for run, truth in held_out.values():
        assert simulate(run.program, both.for_run(run)).step_time == pytest.approx(truth, rel=1e-6)
    alone = calibrate(runs[0])
    zb_h2, truth = held_out["zb-h2"]
    if one_way:
        assert alone.cost_model(2).forward_split is None
        assert simulate(zb_h2.program, alone.for_run(zb_h2)).step_time < truth * 0.97
    else:
        assert alone.cost_model(4).forward_split == pytest.approx(true_costs(4).forward_split, rel=1e-6)
        for name in ("zb-h2", "zbv"):
            run, truth = held_out[name]
            assert simulate(run.program, alone.for_run(run)).step_time == pytest.approx(truth, rel=1e-6)
        assert "(timed by the profile only" in alone.report()
        report = {line.split(":")[0].strip(): line for line in calibrate(runs[1]).report().splitlines()}
        assert "run/profile speed ratio" in report["F_split"] and "timed by the profile only" in report["F"]
        # a ZB-H1 run alone prices the plain F, and B as a switching B costs (B's switch, what its
        # repeats save, is what a run whose I all switch cannot tell)
        truth, zb_alone = true_costs(4), calibrate(runs[1]).cost_model(4)
        assert zb_alone.forward == pytest.approx(truth.forward, rel=1e-6)
        assert zb_alone.backward_full == pytest.approx([b + SWITCH["B"] for b in truth.backward_full], rel=1e-6)
    again = Calibration.from_dict(json.loads(json.dumps(both.to_dict())))
    assert again.cost_model(4).forward_split == both.cost_model(4).forward_split


def test_a_split_forward_seen_at_one_stage_size_scales_with_the_forward(tmp_path, monkeypatch):
    """A machine whose split forward costs 1.15 plain ones at every size. Calibrated on 1F1B,
    ZB-H1 and interleaved runs (the split forward at 4 layers per stage only, F at 4 and 2) with
    profiles of their own way only, the ZB-H1 run's split forward 1 ms dearer per call (its shape
    is not the run's), the split forward of 2-layer stages comes out 1.15x F as the machine's, and ZBV
    (2-layer stages, every forward split) is predicted exactly."""
    monkeypatch.setitem(globals(), "SPLIT_FACTOR", 1.15)
    monkeypatch.setitem(globals(), "SWITCH", {"F": 0.0, "B": 0.0})  # a ratio of switching costs is the machine's
    for name, chunks in (("1f1b", None), ("zb-h1", None), ("interleaved", 2)):
        write_run(tmp_path / name, name, 8, chunks, profile=True, one_way=True)
    profile = json.loads((tmp_path / "zb-h1" / "profile.json").read_text())
    for record in profile["layers"]["records"]:
        record["F"] = [x + 1e-3 for x in record["F"]]
    (tmp_path / "zb-h1" / "profile.json").write_text(json.dumps(profile))
    c = calibrate_runs([read_measured(tmp_path / name) for name in ("1f1b", "zb-h1", "interleaved")])
    fitted, truth = c.cost_model(4), true_costs(4)
    assert fitted.forward_split == pytest.approx(truth.forward_split, rel=1e-6)
    assert fitted.forward == pytest.approx(truth.forward, rel=1e-6)
    exact = write_run(tmp_path / "zbv", "zbv", 4)
    run = read_measured(tmp_path / "zbv")
    assert simulate(run.program, c.for_run(run)).step_time == pytest.approx(exact, rel=1e-6)


def test_a_kind_a_run_measured_is_not_averaged_with_another_runs_profile_estimate(tmp_path, monkeypatch):
    """A 1F1B and a ZB-H1 run whose profiles time the other way's kinds 1 ms dear per call (what
    neither run measured). Together they price each kind from the run that measured it: F and B
    from the 1F1B run, the split forward, I and W from the ZB-H1 run, exactly as the machine; both
    replay themselves."""
    monkeypatch.setitem(globals(), "SPLIT_PER_LAYER", 300_000 * NS)
    for name, other in (("1f1b", ("F_split", "I", "W")), ("zb-h1", ("F", "B"))):
        write_run(tmp_path / name, name, 8, profile=True)
        profile = json.loads((tmp_path / name / "profile.json").read_text())
        for record in profile["layers"]["records"]:
            for kind in other:
                record[kind] = [x + 1e-3 for x in record[kind]]
        (tmp_path / name / "profile.json").write_text(json.dumps(profile))
    runs = [read_measured(tmp_path / name) for name in ("1f1b", "zb-h1")]
    both = calibrate_runs(runs)
    fitted, truth = both.cost_model(2), true_costs(2)
    assert fitted.forward == pytest.approx(truth.forward, rel=1e-6)
    assert fitted.forward_split == pytest.approx(truth.forward_split, rel=1e-6)
    assert fitted.backward_full == pytest.approx(truth.backward_full, rel=1e-6)
    for run in runs:
        assert abs(compare_run(run, both.for_run(run))[0].step_time_error) < 1e-6
