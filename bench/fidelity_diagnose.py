"""Where does a self-replay's missing time go? Per-action measured vs simulated, per rank, per step.

    python bench/fidelity_diagnose.py RUN_DIR [RUN_DIR ...]

For each run (made with ``--profile-layers --profile-p2p``) it calibrates on the run itself and
prints:

- the self-replay: measured median step time vs the simulated one;
- per rank and kind, measured action durations (median, mean, coefficient of variation, 90th
  percentile) beside the simulated duration, and the rank's total busy and idle time per step;
- the profile's (isolated) stage speed vs the in-run speed (the calibration's speed ratio);
- the gaps between actions (executor overhead) measured vs modelled;
- **trace replays**: every step re-simulated with that step's own measured compute durations
  (``trace``; where ranks shared cores, each at full speed as the calibration takes it, since
  the replay shares the processors again), and with each (rank, stage, kind)'s mean duration
  of that step (``step mean``).
  ``trace`` vs measured says whether the dependency structure, transfers and overheads are
  right; ``step mean`` vs ``trace`` is what replaying mean costs loses to the spread of the
  durations (a step's makespan is a max over paths);
- the self-replay with typical costs, then adding the compute spread, the transfer spread and
  the rank, step and step overhead spreads (all: the calibration's model);
- **replays with more of the step measured**: every compute row as measured on a core of its
  own, every transfer its own time (SEND start to arrival: a waiting receiver's RECV end, else
  that RECV's end less the least RECV time; where the receiver came after the data, the law's
  time, at most until it came) and each SEND's time on its rank either its own gap to the next
  row, the calibration's (send overhead, and the wake where its receiver waited while the
  computing ranks and the sender filled the cores) or one constant, the mean gap; and the
  calibration's SENDs with each transfer the law's time at the loads it met. Each with
  the gap after a SEND by kind (its receiver waiting or not): what README's "A send that wakes
  its receiver" quotes.

Writes nothing; the numbers are what README's "Where the time goes at small microbatches" quotes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from schedules.errors import ScheduleError  # noqa: E402
from schedules.ir import COMPUTE_NAMES, SEND_NAMES  # noqa: E402
from sim.costs import CostError  # noqa: E402
from sim.calibration import calibrate, compute_frame, shared_cores  # noqa: E402
from sim.engine import Compiled, _COMPUTE, _SEND, compile_program, replay  # noqa: E402
from sim.measured import read_measured  # noqa: E402
from sim.transfers import TransferRow, law_time, transfer_rows  # noqa: E402

NS = 1e9


def replay_with(compiled: Compiled, resolved, durations: list[list[float]]) -> float:
    """Makespan (s) of the compiled program with each compute op's duration replaced (seconds,
    per rank in stream order; other ops kept)."""
    ops = []
    for rank_ops, rank_durations in zip(compiled.ops, durations):
        row = []
        for op, d in zip(rank_ops, rank_durations):
            row.append((_COMPUTE, round(d * NS), op[2], op[3]) if op[0] == _COMPUTE else op)
        ops.append(tuple(row))
    # the compiled program's other terms (each rank's posting start) kept; ranks sharing cores
    # take the idle share compute_frame's full-speed durations were taken under
    records = replay(dataclasses.replace(compiled, ops=tuple(ops)), resolved.contention, resolved.send_overhead,
                     resolved.recv_overhead, resolved.cores, resolved.transfer_load, resolved.idle_share,
                     wake=resolved.wake_overhead)
    return max(r.last if r.times else 0 for r in records) / NS


def step_replay(compiled: Compiled, durations: list, transfers: dict[int, float], sends: list,
                recv_ns: int) -> float:
    """Span (s: first row's start to last row's end) of one step with each compute op's duration
    (seconds, per rank in stream order), each transfer's time (transfer id -> seconds) and each
    SEND's time on its rank (per rank, seconds per SEND in stream order: a compute op after it,
    which takes nothing from anyone here: no shared cores, no load-dependent transfers)."""
    ops = []
    for rank_ops, rank_durations, rank_sends in zip(compiled.ops, durations, sends):
        row, own = [], iter(rank_sends)
        for op, d in zip(rank_ops, rank_durations):
            if op[0] == _COMPUTE:
                row.append((_COMPUTE, round(d * NS), op[2], op[3]))
            elif op[0] == _SEND:
                row += [(_SEND, op[1], round(transfers[op[1]] * NS), op[3], 1.0), (_COMPUTE, round(next(own) * NS), 0, 0)]
            else:
                row.append(op)
        ops.append(tuple(row))
    records = replay(dataclasses.replace(compiled, ops=tuple(ops)), False, 0, recv_ns)
    return (max(r.times[-1] for r in records if r.times) - min(r.times[0] for r in records if r.times)) / NS


def measured_sends(run, cal, compiled: Compiled) -> dict[str, float]:
    """Print the gap after a SEND by kind and the replays with more of the step measured (module
    docstring); returns each replay's median error over the steps ("own", "model", "mean",
    "law")."""
    m = run.program.schedule.microbatches
    number = {str(a): a.transfer.number(m) for stream in run.program.streams for a in stream if a.kind.is_send}
    cores = shared_cores(run)
    law = (cal.p2p_latency + (run.boundary_bytes[0] / cal.p2p_bandwidth if run.boundary_bytes else 0.0),
           cal.p2p_load_latency)
    by_step: dict[int, dict[str, TransferRow]] = {}
    for t in transfer_rows(run, loads=cores is not None):
        by_step.setdefault(t.step, {})[t.sending] = t
    variants: dict[str, list[float]] = {k: [] for k in ("own", "model", "mean", "law")}
    gaps: dict[bool, list[float]] = {True: [], False: []}
    steps = []
    for step, f in run.step_frames():
        rows = by_step.get(step, {})
        own_time, law_time_of, woke = {}, {}, {}
        for label, t in rows.items():
            by_law = law_time(t.segments, *law).time if t.segments else law[0]
            if t.reached <= t.sent or t.received - t.reached > 2 * cal.recv_overhead:  # it came while it waited
                own_time[number[label]] = max(t.received - (cal.recv_overhead if t.reached > t.sent else 0.0) - t.sent, 0.0)
            else:
                own_time[number[label]] = max(min(by_law, t.reached - t.sent), 0.0)
            law_time_of[number[label]] = by_law
            woke[label] = t.woke_on_full(cores)
        durations, own, model = [], [], []
        for rank in range(run.program.schedule.ranks):
            mine = f[f["rank"] == rank]
            kinds, starts, labels = mine["kind"].to_numpy(), mine["start"].to_numpy(), mine["action"].to_numpy()
            durations.append(list((mine["end"] - mine["start"]).to_numpy() + cal.dispatch_overhead))
            sent = [i for i, kind in enumerate(kinds) if kind in SEND_NAMES]
            own.append([starts[i + 1] - starts[i] if i + 1 < len(starts) else cal.send_overhead for i in sent])
            model.append([cal.send_overhead + cal.wake_overhead * woke.get(labels[i], False) for i in sent])
            for i in sent:
                if i + 1 < len(starts):
                    gaps[rows[labels[i]].woke].append(starts[i + 1] - starts[i])
        steps.append((f["end"].max() - f["start"].min(), durations, own_time, law_time_of, own, model))
    every = gaps[True] + gaps[False]
    mean_gap = float(np.mean(every)) if every else cal.send_overhead
    recv_ns = round(cal.recv_overhead * NS)
    spans = []
    for span, durations, own_time, law_time_of, own, model in steps:
        spans.append(span)
        constant = [[mean_gap] * len(row) for row in own]
        variants["own"].append(step_replay(compiled, durations, own_time, own, recv_ns))
        variants["model"].append(step_replay(compiled, durations, own_time, model, recv_ns))
        variants["mean"].append(step_replay(compiled, durations, own_time, constant, recv_ns))
        variants["law"].append(step_replay(compiled, durations, law_time_of, model, recv_ns))
    for waited, label in ((True, "its receiver waiting"), (False, "the others")):
        v = np.array(gaps[waited]) * 1e6
        if len(v):
            print(f"gap after a SEND, {label}: {len(v)}, mean {v.mean():.0f} us, median {np.median(v):.0f}, "
                  f"90th percentile {np.percentile(v, 90):.0f}")
    measured = np.array(spans)
    labels = {"own": "each SEND its own gap", "model": "the calibration's SENDs (send, wake)",
              "mean": f"one constant, the mean gap {mean_gap * 1e6:.0f} us",
              "law": "the calibration's SENDs, transfers by the law at the loads they met"}
    errors = {k: float(np.median(np.array(v) / measured)) - 1 for k, v in variants.items()}
    print("replays with compute rows and transfers as measured (no sharing), span (first row's start to last "
          "row's end) over the step's measured, median over steps: " + "; ".join(
              f"{labels[k]} {errors[k]:+.1%}" for k in variants))
    return errors


def diagnose(path: str) -> None:
    run = read_measured(path)
    cal = calibrate(run)  # as `sim calibrate` fits it
    costs = cal.for_run(run)
    program = run.program
    resolved = costs.for_schedule(program.schedule)
    compiled = compile_program(program, resolved)
    from sim import simulate

    sim = simulate(program, costs)
    tl = run.timeline.copy()
    tl["dur"] = tl["end"] - tl["start"]
    steps = run.step_times
    metrics = run.step_metrics()
    print(f"== {path}: {program.schedule.name} p={program.schedule.ranks} m={program.schedule.microbatches} "
          f"v={program.schedule.chunks}, {len(steps)} steps")
    st = np.array(steps) * 1e3
    print(f"step time ms: median {np.median(st):.2f}, min {st.min():.2f}, max {st.max():.2f}, "
          f"IQR/median {(np.percentile(st, 75) - np.percentile(st, 25)) / np.median(st):.1%}")
    print(f"self-replay: simulated step {sim.step_time * 1e3:.2f} ms vs measured {np.median(st):.2f} "
          f"({sim.step_time * 1e3 / np.median(st) - 1:+.1%}); makespan {sim.makespan * 1e3:.2f} vs "
          f"{metrics['makespan'].median() * 1e3:.2f}")
    print(f"speed ratio run/profile: {dict((k, round(v, 3)) for k, v in cal.speed_ratio.items())}; "
          f"dispatch {cal.dispatch_overhead * 1e6:.1f} us, switch F {cal.switch_forward * 1e6:.1f} "
          f"B {cal.switch_backward * 1e6:.1f} us, send {cal.send_overhead * 1e6:.1f} us, recv "
          f"{cal.recv_overhead * 1e6:.1f} us, step {cal.step_overhead * 1e6:.1f} us, latency "
          f"{cal.p2p_latency * 1e6:.1f} us")
    simtl = sim.timeline.copy()
    simtl["dur"] = simtl["end"] - simtl["start"]
    print("per rank and kind: measured duration ms (median / mean / CV / p90) vs simulated mean")
    for (rank, kind), g in tl[tl["kind"].isin(COMPUTE_NAMES)].groupby(["rank", "kind"]):
        d = g["dur"].to_numpy() * 1e3
        s = simtl[(simtl["rank"] == rank) & (simtl["kind"] == kind)]["dur"].to_numpy() * 1e3
        print(f"  rank {rank} {kind}: {np.median(d):.3f} / {d.mean():.3f} / {d.std() / d.mean():.2f} / "
              f"{np.percentile(d, 90):.3f}   sim {s.mean():.3f}")
    comp = tl[tl["kind"].isin(COMPUTE_NAMES)]
    busy = comp.groupby(["step", "rank"])["dur"].sum().groupby(level=1).median() * 1e3
    print("busy ms per step (median over steps) measured vs simulated: " + ", ".join(
        f"rank {r} {busy[r]:.2f} vs {sim.timeline[(sim.timeline['rank'] == r) & sim.timeline['kind'].isin(COMPUTE_NAMES)].eval('end - start').sum() * 1e3:.2f}"
        for r in busy.index))
    # gaps: start of next - end of previous (a SEND's end is its start)
    gaps = []
    for (_, rank), f in tl.groupby(["step", "rank"], sort=True):
        end = np.where(f["kind"].isin(SEND_NAMES), f["start"], f["end"]).astype(float)
        g = f["start"].to_numpy()[1:] - end[:-1]
        gaps.append((rank, float(g.sum())))
    gap_by_rank = {}
    for r, g in gaps:
        gap_by_rank.setdefault(r, []).append(g)
    print("gaps between rows, ms per step (median): " + ", ".join(
        f"rank {r} {np.median(v) * 1e3:.3f}" for r, v in sorted(gap_by_rank.items())))
    # trace replays
    # Replays take each compute row at full speed where ranks shared cores (compute_frame), as
    # the engine then shares the processors again; the measured rows hold that slowdown already.
    own = tl.copy()
    full = compute_frame(run, cal.idle_share)
    own.loc[full.index, "dur"] = full["duration"]
    trace, mean_rep, meas = [], [], []
    rank_index = {}
    for step, f in own.groupby("step", sort=True):
        per_rank_trace, per_rank_mean = [], []
        for rank in range(program.schedule.ranks):
            rows = f[f["rank"] == rank]
            dur = rows["dur"].to_numpy() + cal.dispatch_overhead
            is_comp = rows["kind"].isin(COMPUTE_NAMES).to_numpy()
            key = list(zip(rows["stage"], rows["kind"]))
            means = {}
            for k, d, c in zip(key, dur, is_comp):
                if c:
                    means.setdefault(k, []).append(d)
            per_rank_trace.append(list(dur))
            per_rank_mean.append([float(np.mean(means[k])) if c else 0.0 for k, c in zip(key, is_comp)])
            rank_index[rank] = rows
        trace.append(replay_with(compiled, resolved, per_rank_trace))
        mean_rep.append(replay_with(compiled, resolved, per_rank_mean))
        meas.append(float(metrics.loc[metrics["step"] == step, "makespan"].iloc[0]) if "step" in metrics
                    else float("nan"))
    trace, mean_rep = np.array(trace) * 1e3, np.array(mean_rep) * 1e3
    mk = metrics["makespan"].to_numpy() * 1e3
    print(f"makespan ms, median over steps: measured {np.median(mk):.2f}; trace replay {np.median(trace):.2f} "
          f"({np.median(trace) / np.median(mk) - 1:+.1%}); step-mean replay {np.median(mean_rep):.2f} "
          f"({np.median(mean_rep) / np.median(mk) - 1:+.1%}); calibrated replay {sim.makespan * 1e3:.2f} "
          f"({sim.makespan * 1e3 / np.median(mk) - 1:+.1%})")
    plain = dataclasses.replace(costs, duration_spread=(), transfer_spread=(), rank_spread=(), step_spread=(),
                                step_overhead_spread=())
    compute_only = dataclasses.replace(costs, transfer_spread=(), rank_spread=(), step_spread=(),
                                       step_overhead_spread=())
    no_rank = dataclasses.replace(costs, rank_spread=(), step_spread=(), step_overhead_spread=())
    ms = np.median(st)
    print("self-replay step time vs measured median: " + "; ".join(
        f"{label} {simulate(program, c).step_time * 1e3:.2f} ms ({simulate(program, c).step_time * 1e3 / ms - 1:+.1%})"
        for label, c in (("typical costs", plain), ("+ compute spread", compute_only), ("+ transfer spread", no_rank),
                         ("+ rank, step and step overhead spreads", costs))))
    per_step = trace / mk - 1
    print(f"trace replay error per step: median {np.median(per_step):+.1%}, min {per_step.min():+.1%}, "
          f"max {per_step.max():+.1%}")
    measured_sends(run, cal, compiled)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Where a self-replay's missing time goes, per run.")
    parser.add_argument("runs", nargs="+", help="run directories (python -m runtime --out DIR --profile-layers)")
    args = parser.parse_args(argv)
    for path in args.runs:
        try:
            diagnose(path)
        except (ScheduleError, CostError) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
