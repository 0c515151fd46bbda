"""Simulated vs measured at every size: calibrate on one run per shape, predict every other schedule.

    python bench/fidelity.py --out runs/fidelity --figure figures/fidelity.png

A shape group is (model, rows per microbatch, p). Each group's runs hold the lock file
/work/wt/cpu.lock (fcntl, as ``flock`` does) from the first to the last, so that other users'
locked runs of the shared machine do not land between them:

1. in each round (below), three calibration runs with ``--profile-layers --profile-p2p`` at m = 2p: 1F1B (F and B),
   ZB-H1 (F, I and W) and interleaved with 2 chunks (stages of half the size), calibrated: 1F1B alone (``1f1b``),
   with ZB-H1 (``1f1b+zb-h1``, `sim.calibration.calibrate_runs`, as ``sim calibrate`` does), all three (``three``: in-run costs at two
   stage sizes), and after the last round every round's three together (``pooled``: nine runs, so that one
   run's luck averages out, as ``sim calibrate A B C`` does);
   each calibration's self-replay error (`sim.quality.assess`) and the run's step-time spread
   come from its quality report. The group's **noise floor** is the MAPE of predicting each
   round's 1F1B calibration run from another round's 1F1B calibration: the same program on the
   same machine, so what is left is run-to-run variation, which no cost model can predict;
2. every schedule of SCHEDULES at m = p and m = 4p, one run each (zb-auto is left out: its
   program is planned from costs, so it is not one fixed program to predict; looped-bfs, to
   keep the sweep short), predicted from
   each calibration by simulating the run's own program (`Calibration.for_run`); for p = 4
   also from the p = 2 group's 1F1B calibration of the same model and rows (4 ranks share 2
   cores there, which the p = 2 calibration has not seen: the prediction shares the run's
   recorded cores among its ranks, `CostModel.cores`).

The ``three`` and ``pooled`` predictions are also made at each held-out run's own compute level
(``three@level``, ``pooled@level``; ``level_*`` in results.csv: the run's compute per step,
each action on a core of its own, over the calibration's, `sim.comparison`): the error left
there is the model's miss in how actions overlap, wait and spread, the rest a machine that
computed faster or slower than at calibration, or actions the costs price wrongly.

Every held-out case runs --rounds times, round-robin within its group (the calibration runs,
then all cases, then all again), so that the machine's drift hits every case alike; each
round's runs are predicted by that round's calibrations (the machine's speed drifts by 1.5x
over minutes when others load it). Each run also records the share of the CPUs that other processes took while it ran
(``load.json``; /proc/stat minus our children's CPU time). Measured value: the median over rounds of each run's
median step time; predicted: the median over rounds of the predictions; spread: the runs' step-time interquartile range over the
median (median over rounds); range: lowest to highest of the rounds' medians. Ordering: for each
group and m, every pair of schedules whose ranges do not overlap must be ordered by the
prediction as measured. Writes OUT/results.csv, OUT/calibrations.csv (each calibration's
self-replays and the compute growth it fitted) and OUT/summary.json
(keeping the other groups an earlier invocation wrote there), the figure (predicted vs measured,
from the pooled calibration), and prints markdown tables. ``--reuse`` reads runs that already exist; ``--groups`` picks groups by name
(e.g. ``mlp-8-p2``; a name not in GROUPS is refused).

``--alternate`` makes each round's seventeen runs (calibration and held-out alike) in one launch
whose steps are dealt out in turn (bench/alternate_runs.py; ``--rewarm`` unmeasured steps first at
each turn, so that a measured step starts on its own warm caches): a calibration and the runs it
predicts then share the machine's every second, and the error left is the model's, not the
machine's drift between launches. The noise floor still compares different launches (rounds).

``--skip GROUP:SCHEDULE-mM`` (repeatable) leaves one held-out case of a group unmeasured and
unpredicted, for a case this machine cannot hold: gpt 256 rows p=4's GPipe m=16 keeps 4.3-4.8 GB
of activations on each of its four ranks, and its alternated round was killed for memory on a
24 GiB machine (bench/fidelity_sweeps.md, "Sweep 28").

``--with-gpipe`` adds a fourth calibration run per round, GPipe at m = 2p with the same profiles,
and the ``four`` calibration (the three and it): GPipe's phases are the runs of repeats that tell
the repeat discount (sim.calibration); the three runs at p = 2 cannot.
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import math
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sim import simulate  # noqa: E402
from sim.calibration import calibrate_runs  # noqa: E402
from sim.comparison import compare_run  # noqa: E402
from sim.quality import assess  # noqa: E402
from sim.costs import CostError  # noqa: E402
from sim.measured import read_measured  # noqa: E402
from sim.metrics import step_spread  # noqa: E402

# The models' flags (runtime.ModelSpec's fields but the batch size, which is rows x m).
MODEL_SPECS = {
    "mlp": {"model": "mlp", "layers": 8, "hidden": 512},
    "gpt": {"model": "gpt", "layers": 8, "hidden": 128, "heads": 4, "seq_len": 64, "vocab": 256},
}
MODELS = {name: [token for key, value in spec.items() for token in (f"--{key.replace('_', '-')}", str(value))]
          for name, spec in MODEL_SPECS.items()}
# (model, rows per microbatch, p), in the order they run.
# gpt 64 and 256 rows at p=4 come last: a step of theirs takes seconds (1.8-7.4 s at 64 rows,
# 6.7-34 s at 256, about twice p=2's), so they are measured in shorter runs (--rewarm 0 --steps 8
# --warmup 1 --calibration-steps 24), gpt 256 rows without GPipe m=16 (--skip gpt-256-p4:gpipe-m16:
# bench/fidelity_sweeps.md, "Sweeps 27 and 28").
GROUPS = [("mlp", 8, 2), ("mlp", 256, 2), ("mlp", 2, 2), ("mlp", 64, 2), ("gpt", 8, 2), ("gpt", 1, 2),
          ("gpt", 64, 2), ("mlp", 8, 4), ("mlp", 256, 4), ("gpt", 8, 4), ("mlp", 2, 4), ("gpt", 1, 4),
          ("mlp", 64, 4), ("gpt", 256, 2), ("gpt", 64, 4), ("gpt", 256, 4)]
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev")
CHUNKS = {"interleaved": 2}
# A 1F1B run (F, B), a ZB-H1 run (F, I, W) and an interleaved run (stages of half the size, two
# per rank): the three together give in-run costs at two stage sizes (sim.calibration, several runs).
CALIBRATION_SCHEDULES = ("1f1b", "zb-h1", "interleaved")
# With --with-gpipe, a GPipe run at m = 2p too: its phases are runs of 2p repeats, which tell what a
# long run of repeats saves (sim.calibration, repeat discount); the three runs hold 2 at most at p = 2.
REPEATS_SCHEDULE = "gpipe"
LOCK = "/work/wt/cpu.lock"
# Calibrations whose predictions are also made at each held-out run's own compute level
# (`sim.comparison`: the costs scaled so that the program's compute is what the run measured),
# which separates a change of the machine's speed, or a mispriced action, from the model's
# miss in how actions overlap, wait and spread.
AT_LEVEL = ("three", "pooled", "four")


def group_name(model: str, rows: int, p: int) -> str:
    return f"{model}-{rows}-p{p}"


def held_out_cases(p: int) -> list[tuple[str, int]]:
    """A group's held-out (schedule, m) at `p` ranks: every schedule at m = p and m = 4p."""
    return list(itertools.product(SCHEDULES, (p, 4 * p)))


def case_name(group: str, schedule: str, m: int) -> str:
    """How --skip names a held-out case: GROUP:SCHEDULE-mM."""
    return f"{group}:{schedule}-m{m}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CpuLock:
    """The machine-wide lock that measured runs hold, so that two sweeps never share the cores.
    Taken at the first run a group must make and held to the group's end: predicting runs that
    already exist (``--reuse``) waits for nobody."""

    def __init__(self, path: str):
        self.path = Path(path)
        self.file = None

    def take(self) -> None:
        if self.file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a")
            fcntl.flock(self.file, fcntl.LOCK_EX)

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing releases the flock
            self.file = None


@dataclass(frozen=True)
class Case:
    """One run a round makes: its directory, program, measured steps, and whether it profiles."""

    out: Path
    schedule: str
    m: int
    steps: int
    profile: bool


def launch(command: list[str], outs: list[Path], reuse: bool, lock: CpuLock) -> None:
    """Run `command` (under the CPU lock) to make the run directories `outs`, unless `reuse` finds
    them all made; records in each the share of the CPUs other processes took meanwhile."""
    if reuse and all((out / "summary.json").is_file() for out in outs):
        return
    lock.take()
    for out in outs:
        if out.exists():
            shutil.rmtree(out)  # a run cut short
        out.parent.mkdir(parents=True, exist_ok=True)
    started, jiffies, ours = time.time(), cpu_jiffies(), children_cpu()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    wall = time.time() - started
    # CPU time others took while the run ran, as a share of the machine (/proc/stat minus our children)
    others = max((cpu_jiffies() - jiffies) / os.sysconf("SC_CLK_TCK") - (children_cpu() - ours), 0.0) / (
        wall * os.cpu_count())
    for out in outs:
        (out / "load.json").write_text(json.dumps({"wall_seconds": wall, "others_cpu_share": others}) + "\n")
    names = outs[0].name if len(outs) == 1 else f"{len(outs)} runs alternated"
    print(f"  {names}: {wall:.1f} s, others took {100 * others:.0f}% of the CPUs", file=sys.stderr, flush=True)


def torchrun(p: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(p), "--master-port", str(free_port())]


def run_case(case: Case, model: str, rows: int, p: int, warmup: int, reuse: bool, lock: CpuLock) -> None:
    """One executor run (`python -m runtime`) in a launch of its own."""
    command = [*torchrun(p), "-m", "runtime", "--schedule", case.schedule, "--microbatches", str(case.m),
               *MODELS[model], "--batch-size", str(rows * case.m), "--steps", str(case.steps), "--warmup", str(warmup),
               "--out", str(case.out)]
    if case.schedule in CHUNKS:
        command += ["--chunks", str(CHUNKS[case.schedule])]
    if case.profile:
        command += ["--profile-layers", "--profile-p2p"]
    launch(command, [case.out], reuse, lock)


def run_alternated(plan_path: Path, cases: list[Case], model: str, rows: int, p: int, warmup: int, rewarm: int,
                   reuse: bool, lock: CpuLock) -> None:
    """Every case in one launch, their steps alternated (bench/alternate_runs.py, its plan written to `plan_path`)."""
    plan = {"model": MODEL_SPECS[model], "warmup": warmup, "rewarm": rewarm,
            "runs": [{"out": str(c.out), "schedule": c.schedule, "microbatches": c.m, "chunks": CHUNKS.get(c.schedule),
                      "batch_size": rows * c.m, "steps": c.steps, "profile": c.profile} for c in cases]}
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_text(json.dumps(plan, indent=1) + "\n")
    launch([*torchrun(p), str(Path(__file__).with_name("alternate_runs.py")), str(plan_path)],
           [c.out for c in cases], reuse, lock)


def cpu_jiffies() -> int:
    """Busy jiffies of the whole machine (user + nice + system + irq + softirq + steal)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return user + nice + system + irq + softirq + steal


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def others_share(run_dir: Path) -> float:
    path = run_dir / "load.json"
    return json.loads(path.read_text())["others_cpu_share"] if path.is_file() else float("nan")


def predict(calibration, run) -> float:
    try:
        return simulate(run.program, calibration.for_run(run)).step_time
    except CostError as exc:
        print(f"  cannot predict {run.path}: {exc}", file=sys.stderr)
        return float("nan")


def predict_at_level(calibration, run) -> tuple[float, float, float, float]:
    """(step time predicted, the run's compute level against the calibration's costs, step time
    predicted with the costs at that level, the step-time spread over the prediction's draws):
    `sim.comparison.compare_run`."""
    try:
        c, _ = compare_run(run, calibration.for_run(run), calibration.dispatch_overhead)
    except CostError as exc:
        print(f"  cannot predict {run.path}: {exc}", file=sys.stderr)
        return float("nan"), float("nan"), float("nan"), float("nan")
    return c.step_time_simulated, c.compute_level, c.step_time_at_run_level, c.step_time_spread_simulated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/fidelity")
    parser.add_argument("--figure", default=None)
    parser.add_argument("--groups", nargs="*", default=None, help="group names to run (default all)")
    # A run's median step time is what every prediction is checked against: over 12 steps that
    # spread 15% (mlp 8 rows) its standard error is near 4%, twice the self-replay target; 48
    # steps halve it and cost little where steps are short.
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calibration-steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--with-gpipe", action="store_true",
                        help="a GPipe m=2p calibration run per round too, and the 'four' calibration")
    parser.add_argument("--alternate", action="store_true",
                        help="make each round's runs in one launch, their steps alternated (bench/alternate_runs.py)")
    parser.add_argument("--rewarm", type=int, default=None,
                        help="with --alternate: unmeasured steps a run takes at each turn before its measured one "
                             "(default 1)")
    parser.add_argument("--skip", action="append", default=[], metavar="GROUP:SCHEDULE-mM",
                        help="leave this held-out case out (e.g. gpt-256-p4:gpipe-m16); repeatable")
    args = parser.parse_args()
    if args.rewarm is not None and not args.alternate:
        parser.error("--rewarm needs --alternate")
    if args.rewarm is not None and args.rewarm < 0:
        parser.error(f"--rewarm must be 0 or more, got {args.rewarm}")
    rewarm = 1 if args.rewarm is None else args.rewarm
    known = [group_name(*g) for g in GROUPS]
    unknown = sorted(set(args.groups or ()) - set(known))
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(known)}")
    skipped = set(args.skip)
    every_case = {case_name(group_name(*g), s, m) for g in GROUPS for s, m in held_out_cases(g[2])}
    if skipped - every_case:
        parser.error(f"unknown case(s) to skip {', '.join(sorted(skipped - every_case))}; a case is GROUP:SCHEDULE-mM "
                     f"with m = p or 4p, e.g. gpt-256-p4:gpipe-m16")
    root = Path(args.out)
    chosen = [g for g in GROUPS if args.groups is None or group_name(*g) in args.groups]
    rows_out, calib_out = [], []
    p2_calibrations = {}
    floors = {}  # group -> noise floor (`noise_floor`)
    began = time.time()
    for model, rows, p in chosen:
        name = group_name(model, rows, p)
        print(f"{name} ({time.time() - began:.0f} s in)", file=sys.stderr, flush=True)
        base = root / name
        lock = CpuLock(LOCK)
        cases = [(s, m) for s, m in held_out_cases(p) if case_name(name, s, m) not in skipped]
        measured = {case: [] for case in cases}
        rounds = []  # per round: its calibrations
        own_runs = []  # per round: its calibration runs
        for k in range(args.rounds):
            suffix = "" if k == 0 else f"-r{k}"
            calibrating = [Case(base / f"calibrate-{s}{suffix}", s, 2 * p, args.calibration_steps, True)
                           for s in CALIBRATION_SCHEDULES + ((REPEATS_SCHEDULE,) if args.with_gpipe else ())]
            held_out = [Case(base / f"{s}-m{m}{suffix}", s, m, args.steps, False) for s, m in cases]
            if args.alternate:
                run_alternated(base / f"alternate{suffix}.json", calibrating + held_out, model, rows, p, args.warmup,
                               rewarm, args.reuse, lock)
            else:
                for case in calibrating + held_out:
                    run_case(case, model, rows, p, args.warmup, args.reuse, lock)
            made = [read_measured(c.out) for c in calibrating]
            trio = made[:len(CALIBRATION_SCHEDULES)]
            own_runs.append(trio)
            rounds.append({"1f1b": assess(calibrate_runs(trio[:1]), trio[:1]),
                           "1f1b+zb-h1": assess(calibrate_runs(trio[:2]), trio[:2]),
                           "three": assess(calibrate_runs(trio), trio)})
            if args.with_gpipe:
                rounds[-1]["four"] = assess(calibrate_runs(made), made)
            for (schedule, m), c in zip(cases, held_out):
                measured[(schedule, m)].append(read_measured(c.out))
        lock.release()
        every = [r for trio in own_runs for r in trio]
        pooled = assess(calibrate_runs(every), every)
        for calibrations in rounds:
            calibrations["pooled"] = pooled
        floor = noise_floor([c["1f1b"] for c in rounds], [trio[0] for trio in own_runs])
        floors[name] = floor
        print(f"  noise floor (another round's 1F1B run predicted from this one's): MAPE {100 * floor:.1f}%",
              file=sys.stderr, flush=True)
        if p == 2:
            p2_calibrations[(model, rows)] = [c["1f1b"] for c in rounds]
        for k, calibrations in enumerate(rounds):
            for label, c in calibrations.items():
                if label == "pooled" and k > 0:
                    continue  # one calibration for every round: its quality once
                for entry in c.quality["runs"]:
                    low, high = entry["step_time_interval"]
                    calib_out.append({"group": name, "round": k, "calibration": label,
                                      **{key: v for key, v in entry.items() if key != "step_time_interval"},
                                      "interval_low": low, "interval_high": high,
                                      "compute_growth": c.compute_growth, "growth_horizon": c.growth_horizon})
        for (schedule, m), runs in measured.items():
            medians = [float(np.median(r.step_times)) for r in runs]
            mid = float(np.median(medians))
            spreads = [step_spread(r.step_times) for r in runs]
            row = {"group": name, "model": model, "rows": rows, "p": p, "schedule": schedule, "m": m,
                   "measured_ms": mid * 1e3, "q1_ms": min(medians) * 1e3, "q3_ms": max(medians) * 1e3,
                   "spread": float(np.median(spreads)), "rounds": len(runs),
                   "others_cpu": float(np.nanmax([others_share(r.path) for r in runs]))}
            for label in rounds[0]:
                # each round's runs predicted by that round's calibration, then the median over rounds
                if label not in AT_LEVEL:
                    predicted = float(np.median([predict(c[label], r) for c, r in zip(rounds, runs)]))
                    row[f"pred_{label}_ms"], row[f"err_{label}"] = predicted * 1e3, predicted / mid - 1
                    continue
                got = np.array([predict_at_level(c[label], r) for c, r in zip(rounds, runs)])
                predicted, level, at_level, drawn = (float(np.median(got[:, j])) for j in range(4))
                row[f"pred_{label}_ms"], row[f"err_{label}"] = predicted * 1e3, predicted / mid - 1
                row[f"level_{label}"] = level
                row[f"pred_{label}@level_ms"], row[f"err_{label}@level"] = at_level * 1e3, at_level / mid - 1
                row[f"spread_{label}"] = drawn  # the runs' step-time spread as the prediction's draws give it
            if p == 4 and (model, rows) in p2_calibrations:
                predicted = float(np.median([predict(c, r) for c, r in zip(p2_calibrations[(model, rows)], runs)]))
                row["pred_p2_ms"], row["err_p2"] = predicted * 1e3, predicted / mid - 1
            rows_out.append(row)
        write_keeping_others(pd.DataFrame(rows_out), root / "results.csv")
        write_keeping_others(pd.DataFrame(calib_out), root / "calibrations.csv")
    table = pd.DataFrame(rows_out)
    summary = summarize(table)
    for name, floor in floors.items():
        summary["groups"][name]["noise_floor"] = floor
    summary["seconds"] = time.time() - began
    earlier = root / "summary.json"
    if earlier.is_file():  # groups of earlier invocations into the same OUT stay
        summary["groups"] = {**json.loads(earlier.read_text()).get("groups", {}), **summary["groups"]}
    earlier.write_text(json.dumps(summary, indent=2) + "\n")
    print_tables(table, pd.DataFrame(calib_out), summary)
    if args.figure:
        figure(table, args.figure)
    return 0


def write_keeping_others(frame: pd.DataFrame, path: Path) -> None:
    """Write `frame` to the CSV `path`, keeping the rows of groups it does not hold from an
    earlier invocation into the same OUT (groups are often run a few per invocation)."""
    if path.is_file() and len(frame):
        earlier = pd.read_csv(path)
        frame = pd.concat([earlier[~earlier["group"].isin(frame["group"])], frame], ignore_index=True)
    frame.to_csv(path, index=False)


def noise_floor(calibrations, runs) -> float:
    """MAPE of predicting each round's 1F1B calibration run from every other round's 1F1B
    calibration: the same program, shape and machine, so the error is run-to-run variation
    alone (which core state, allocator and neighbours a run got). No model can predict a
    held-out run closer than this on average."""
    errors = [predict(c, run) / run.step_time_median - 1
              for (j, run), (k, c) in itertools.product(enumerate(runs), enumerate(calibrations)) if j != k]
    return float(np.nanmean(np.abs(errors))) if errors else float("nan")


def summarize(table: pd.DataFrame) -> dict:
    """MAPE per group and calibration, the largest error, and the ordering check."""
    out = {"groups": {}}
    labels = [c[len("err_"):] for c in table.columns if c.startswith("err_")]
    for name, g in table.groupby("group", sort=False):
        entry = {}
        for label in labels:
            err = g[f"err_{label}"].dropna()
            if not len(err):
                continue
            worst = g.loc[err.abs().idxmax()]
            predicted = g.loc[err.index, f"pred_{label}_ms"]
            entry[label] = {"mape": float(err.abs().mean()), "largest": float(err.loc[err.abs().idxmax()]),
                            "largest_case": f"{worst['schedule']} m={worst['m']}",
                            "ordering": ordering(g, f"pred_{label}_ms"),
                            # the rounds' own lowest to highest median: a prediction there is as close
                            # as the machine's run-to-run variation lets a measurement say
                            "inside_rounds": int(((predicted >= g.loc[err.index, "q1_ms"])
                                                  & (predicted <= g.loc[err.index, "q3_ms"])).sum()),
                            "cases": int(len(err))}
        entry["median_spread"] = float(g["spread"].median())
        if "spread_three" in g:
            entry["median_spread_three"] = float(g["spread_three"].median())
        out["groups"][name] = entry
    return out


def ordering(g: pd.DataFrame, column: str) -> dict:
    """Pairs (same m) whose rounds' ranges do not overlap, and how many the prediction orders so."""
    pairs, agreed, missed = 0, 0, []
    for _, h in g.groupby("m"):
        for (_, a), (_, b) in itertools.combinations(h.iterrows(), 2):
            if a["q3_ms"] < b["q1_ms"] or b["q3_ms"] < a["q1_ms"]:
                pairs += 1
                if (a["measured_ms"] < b["measured_ms"]) == (a[column] < b[column]):
                    agreed += 1
                else:
                    missed.append(f"{a['schedule']}/{b['schedule']} m={a['m']}")
    return {"pairs": pairs, "agreed": agreed, "missed": missed}


def print_tables(table: pd.DataFrame, calib: pd.DataFrame, summary: dict) -> None:
    print("| group | round | calibration | run | measured ms | simulated ms | self-replay error "
          "| measured median's 95% interval | step-time spread |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for _, r in calib.iterrows():
        print(f"| {r['group']} | {r['round']} | {r['calibration']} | {r['schedule']} | {r['step_time_measured'] * 1e3:.2f} | "
              f"{r['step_time_simulated'] * 1e3:.2f} | {100 * r['self_replay_error']:+.1f}% | "
              f"{100 * r['interval_low']:+.1f}% to {100 * r['interval_high']:+.1f}% | "
              f"{100 * r['step_time_spread']:.1f}% |")
    print()
    has_p2 = "err_p2" in table.columns
    labels = [c[len("err_"):] for c in table.columns if c.startswith("err_") and c != "err_p2"]
    print("| group | schedule | m | measured ms (range of rounds) | spread in a run |"
          + "".join(f" from {label} | error |" for label in labels) + (" from p=2 1f1b | error |" if has_p2 else ""))
    print("|---|---|---:|---:|---:|" + "---:|---:|" * (len(labels) + has_p2))
    for _, r in table.iterrows():
        line = (f"| {r['group']} | {r['schedule']} | {r['m']} | {r['measured_ms']:.2f} ({r['q1_ms']:.2f}-{r['q3_ms']:.2f}) "
                f"| {100 * r['spread']:.0f}% |"
                + "".join(f" {r[f'pred_{label}_ms']:.2f} | {100 * r[f'err_{label}']:+.1f}% |" for label in labels))
        if has_p2:
            line += (f" {r['pred_p2_ms']:.2f} | {100 * r['err_p2']:+.1f}% |" if not pd.isna(r.get("err_p2"))
                     else " | |")
        print(line)
    print()
    print("| group | median spread | noise floor | calibration | MAPE | inside the rounds' range | largest error "
          "| ordering (pairs beyond the rounds' range) |")
    print("|---|---:|---:|---|---:|---:|---|---|")
    for name, entry in summary["groups"].items():
        for label, s in entry.items():
            if label in ("median_spread", "median_spread_three", "noise_floor"):
                continue
            o = s["ordering"]
            drawn = entry.get("median_spread_three")
            print(f"| {name} | {100 * entry['median_spread']:.0f}%"
                  + (f" (three's draws {100 * drawn:.0f}%)" if drawn is not None else "") + " |"
                  f" {100 * entry.get('noise_floor', math.nan):.1f}% | {label} | {100 * s['mape']:.1f}% | "
                  f"{s['inside_rounds']}/{s['cases']} | {100 * s['largest']:+.1f}% ({s['largest_case']}) | {o['agreed']}/{o['pairs']}"
                  + (f" (missed {', '.join(o['missed'])})" if o["missed"] else "") + " |")


def figure(table: pd.DataFrame, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    # more groups than the default cycle's ten colours: tab20's dark tones, then its light ones, and a
    # marker per model, so that every group stays apart
    colours = plt.get_cmap("tab20").colors
    for k, (name, g) in enumerate(table.groupby("group", sort=False)):
        ax.errorbar(g["measured_ms"], g["pred_pooled_ms"], xerr=[g["measured_ms"] - g["q1_ms"], g["q3_ms"] - g["measured_ms"]],
                    fmt="s" if g["model"].iloc[0] == "gpt" else "o", ms=4, color=colours[(2 * k) % 20 + (k >= 10)],
                    label=name, alpha=0.8)
    lo, hi = table["measured_ms"].min() * 0.8, table["measured_ms"].max() * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="0.85", label="within 5%")
    ax.set(xscale="log", yscale="log", xlabel="measured step time, ms (median of rounds, bar: their range)",
           ylabel="predicted from the pooled calibration, ms", title="held-out runs, every schedule (bench/fidelity.py)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
