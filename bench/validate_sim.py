"""Simulated vs measured: calibrate on one executor run, predict held-out runs, table and figure.

Run (about 25 minutes on 2 cores; run it when the machine is otherwise idle):

    python bench/validate_sim.py --out runs/validate --figure figures/sim_vs_measured.png

Per model (``mlp`` and ``gpt``, sizes in MODELS) it

1. makes one calibration run per ``--calibrate-on`` entry (default ``1f1b:8``, one
   stage per rank, then ``interleaved:8``, which has every stage role and the most
   transfers; the figure shows the first):
   ``torchrun --nproc-per-node 2 -m runtime`` with
   ``--profile-layers --profile-p2p`` and --calibration-steps steps, and fits a
   `sim.calibration.Calibration` to each;
2. predicts from each calibration alone the step time of gpipe, 1f1b and interleaved
   (v=2) at each m: the schedule is built and simulated under
   ``calibration.for_stages(num_stages)`` (the executor's default balanced layer cut);
3. runs every held-out case --rounds times, round-robin (all cases, then all again) so
   that slow drift of the machine's speed hits every case alike; the measured value of a
   case is the median over its runs of each run's median step time. Held-out runs are
   fresh runs; no calibration run is one of them.

The microbatch size is fixed (batch size = rows x m), so per-microbatch costs are the
same in every case. Runs use the executor's defaults (gloo on CPU, every receive of a
step posted at its start). While a run executes, the CPU time that other processes take is
measured from /proc/stat; before each run the bench waits (up to --wait seconds) for an
idle machine, and a run during which others took more than --max-others of the CPUs is
repeated (up to --retries times, keeping the least disturbed try).

With --reuse, run directories that already hold a complete run are read, not rerun
(predictions are recomputed from the calibration runs). Writes OUT/results.csv (one row
per case and calibration), OUT/summary.json (MAPE per model and calibration, ranking
agreement, spread of the repeated runs) and the figure (the first calibration's
predictions); prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

import schedules  # noqa: E402
from schedules import ScheduleError  # noqa: E402
from sim import simulate  # noqa: E402
from sim.calibration import calibrate  # noqa: E402
from sim.measured import read_measured  # noqa: E402

# Sizes where compute dominates the executor's fixed costs (an F of a 1F1B stage takes
# 10-15 ms) and one step takes 0.1-1 s.
MODELS = {
    "mlp": {"flags": ["--model", "mlp", "--layers", "16", "--hidden", "512"], "rows": 256},
    "gpt": {"flags": ["--model", "gpt", "--layers", "8", "--hidden", "128", "--heads", "4", "--seq-len", "64",
                      "--vocab", "256"], "rows": 8},
}
SCHEDULES = ("gpipe", "1f1b", "interleaved")
CHUNKS = {"interleaved": 2}
RANKS = 2


def cpu_jiffies() -> int:
    """Busy jiffies of the whole machine (user + nice + system + irq + softirq + steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq + steal


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def busy_share(seconds: float) -> float:
    """Share of the machine's CPU time that is busy over the next `seconds` (this process sleeps)."""
    hz = os.sysconf("SC_CLK_TCK")
    before = cpu_jiffies()
    time.sleep(seconds)
    return (cpu_jiffies() - before) / hz / (seconds * os.cpu_count())


def wait_quiet(limit: float, most: float) -> None:
    """Wait (up to `limit` seconds) until the machine is at most `most` busy for 2 s."""
    deadline = time.monotonic() + limit
    while busy_share(2.0) > most and time.monotonic() < deadline:
        pass


def launch(out: Path, schedule: str, m: int, model: dict, steps: int, warmup: int, profile: bool) -> float:
    """One executor run; returns the share of the machine other processes used meanwhile."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS),
        "-m", "runtime", "--schedule", schedule, "--microbatches", str(m), *model["flags"],
        "--batch-size", str(model["rows"] * m), "--steps", str(steps), "--warmup", str(warmup), "--out", str(out),
    ]
    if schedule in CHUNKS:
        command += ["--chunks", str(CHUNKS[schedule])]
    if profile:
        command += ["--profile-layers", "--profile-p2p"]
    hz = os.sysconf("SC_CLK_TCK")
    busy0, mine0, wall0 = cpu_jiffies(), children_cpu(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - wall0
    busy, mine = (cpu_jiffies() - busy0) / hz, children_cpu() - mine0
    if done.returncode != 0:
        raise SystemExit(f"run {out} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return max(busy - mine, 0.0) / (wall * os.cpu_count())


def measured_run(out: Path, schedule: str, m: int, model: dict, args, steps: int, profile: bool = False):
    """(run, others' CPU share): reused if complete, else run until undisturbed (or the
    least disturbed of 1 + --retries tries)."""
    if args.reuse:
        try:
            return read_measured(out), float("nan")
        except ScheduleError:
            pass
    tries = []
    for attempt in range(args.retries + 1):
        wait_quiet(args.wait, args.max_others)
        where = out.with_name(f"{out.name}.try{attempt}")
        if where.exists():
            shutil.rmtree(where)
        others = launch(where, schedule, m, model, steps, args.warmup, profile)
        tries.append((others, attempt, where))
        if others <= args.max_others:
            break
        print(f"  {out.name}: other processes took {100 * others:.0f}% of the CPUs"
              + (", retrying" if attempt < args.retries else ""), file=sys.stderr)
        time.sleep(args.pause)
    others, _, best = min(tries)
    if out.exists():
        shutil.rmtree(out)
    best.rename(out)
    for _, _, where in tries:
        if where.exists():
            shutil.rmtree(where)
    return read_measured(out), others


def predict(calibration, schedule: str, m: int) -> float:
    """Step time of `schedule` at m from the calibration alone (balanced layer cut)."""
    built = schedules.build(schedule, ranks=RANKS, microbatches=m, chunks=CHUNKS.get(schedule))
    return simulate(built, calibration.for_stages(built.num_stages)).step_time


def validate_model(name: str, args) -> list[dict]:
    model = MODELS[name]
    root = Path(args.out) / name
    calibrations = {}
    for entry in args.calibrate_on:
        schedule, m = entry.split(":")
        print(f"{name}: calibration run ({schedule}, m={m})", file=sys.stderr)
        run, _ = measured_run(root / f"calibration-{schedule}-m{m}", schedule, int(m), model, args,
                              args.calibration_steps, profile=True)
        calibrations[entry] = calibrate(run)
        calibrations[entry].to_json(root / f"costs-{schedule}-m{m}.json")
    cases = [(s, m) for m in args.microbatches for s in args.schedules]
    runs: dict[tuple, list] = {case: [] for case in cases}
    for k in range(args.rounds):
        for schedule, m in cases:
            run, others = measured_run(root / f"{schedule}-m{m}-r{k}", schedule, m, model, args, args.steps)
            runs[(schedule, m)].append((run.step_time_median, others))
            print(f"  round {k}: {schedule:12} m={m:<3} {1e3 * run.step_time_median:8.1f} ms "
                  f"(others {100 * others:.0f}% CPU)", file=sys.stderr)
    rows = []
    for schedule, m in cases:
        times = [t for t, _ in runs[(schedule, m)]]
        measured = median(times)
        for entry, calibration in calibrations.items():
            predicted = predict(calibration, schedule, m)
            rows.append({
                "model": name, "calibration": entry, "schedule": schedule, "microbatches": m,
                "chunks": CHUNKS.get(schedule, 1), "measured_ms": 1e3 * measured,
                "runs_min_ms": 1e3 * min(times), "runs_max_ms": 1e3 * max(times), "runs": len(times),
                "runs_ms": " ".join(f"{1e3 * t:.1f}" for t in times),
                "predicted_ms": 1e3 * predicted, "error_pct": 100 * (predicted - measured) / measured,
                "others_cpu_pct_max": 100 * max(o for _, o in runs[(schedule, m)]),
            })
    return rows


def rankings(table: pd.DataFrame) -> list[dict]:
    """Per model, calibration and m: schedules ordered by measured and by predicted step time.

    Besides the strict order of the medians, two checks that account for run-to-run
    noise: ``round_orders`` (the order in each round alone: if they differ, the medians'
    order is not reproducible) and ``pairs``: every pair of schedules whose repeated runs
    do not overlap (all runs of one faster than all runs of the other) is a measured
    difference, and ``significant_same`` says whether the prediction orders every such
    pair the same way. Pairs whose runs overlap are ties at this noise level.
    """
    out = []
    for (model, calibration, m), group in table.groupby(["model", "calibration", "microbatches"], sort=False):
        measured = list(group.sort_values("measured_ms")["schedule"])
        predicted = list(group.sort_values("predicted_ms")["schedule"])
        runs = {r.schedule: [float(x) for x in str(r.runs_ms).split()] for r in group.itertuples()}
        predicted_ms = dict(zip(group["schedule"], group["predicted_ms"]))
        rounds = min(len(v) for v in runs.values())
        round_orders = [sorted(runs, key=lambda s: runs[s][k]) for k in range(rounds)]
        pairs = []
        names = list(runs)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if max(runs[a]) < min(runs[b]):
                    faster, slower = a, b
                elif max(runs[b]) < min(runs[a]):
                    faster, slower = b, a
                else:
                    continue
                pairs.append({"faster": faster, "slower": slower,
                              "predicted_same": bool(predicted_ms[faster] < predicted_ms[slower])})
        out.append({"model": model, "calibration": calibration, "microbatches": int(m),
                    "measured_order": measured, "predicted_order": predicted, "same": measured == predicted,
                    "round_orders": round_orders,
                    "rounds_agree": all(o == round_orders[0] for o in round_orders),
                    "significant_pairs": pairs,
                    "significant_same": all(p["predicted_same"] for p in pairs)})
    return out


def plot(table: pd.DataFrame, path: Path) -> None:
    """Per model: measured (filled, solid; bars: range of the repeated runs) and predicted
    (open, dashed) step time per microbatch against m, for the first calibration (per
    microbatch, so that the few percent between schedules are visible at every m)."""
    from matplotlib.figure import Figure

    from sim.plot.readme import shrink_png
    from sim.plot.style import OKABE_ITO

    first = table["calibration"].iloc[0]
    table = table[table["calibration"] == first]
    colours = {"gpipe": OKABE_ITO["blue"], "1f1b": OKABE_ITO["orange"], "interleaved": OKABE_ITO["bluish_green"]}
    models = list(dict.fromkeys(table["model"]))
    fig = Figure(figsize=(4.0 * len(models), 3.4), layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        part = table[table["model"] == model]
        for schedule, rows in part.groupby("schedule", sort=False):
            rows = rows.sort_values("microbatches")
            m = rows["microbatches"]
            colour = colours.get(schedule, OKABE_ITO["black"])
            spread = [(rows["measured_ms"] - rows["runs_min_ms"]) / m, (rows["runs_max_ms"] - rows["measured_ms"]) / m]
            ax.errorbar(m, rows["measured_ms"] / m, yerr=spread, fmt="o-", color=colour, capsize=2,
                        label=f"{schedule} measured")
            ax.plot(m, rows["predicted_ms"] / m, "s--", color=colour, markerfacecolor="white",
                    label=f"{schedule} predicted")
        mape = part["error_pct"].abs().mean()
        ax.set_title(f"{model}: MAPE {mape:.1f}% over {len(part)} held-out cases", fontsize=9)
        ax.set_xscale("log", base=2)
        ticks = sorted(part["microbatches"].unique())
        ax.set_xticks(ticks, labels=[str(m) for m in ticks])
        ax.set_xlabel("microbatches m (fixed microbatch size)")
        ax.set_ylabel("median step time / m (ms)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, frameon=False)
    fig.suptitle(f"Simulator calibrated on one run ({first.replace(':', ', m=')}) vs executor: 2 ranks, gloo on CPU",
                 fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    shrink_png(path)


def markdown(table: pd.DataFrame) -> str:
    lines = ["| model | calibrated on | schedule | m | measured (ms) | runs (ms) | predicted (ms) | error |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in table.itertuples():
        lines.append(f"| {r.model} | {r.calibration.replace(':', ' m=')} | {r.schedule} | {r.microbatches} | "
                     f"{r.measured_ms:.1f} | {r.runs_min_ms:.0f}-{r.runs_max_ms:.0f} | {r.predicted_ms:.1f} | "
                     f"{r.error_pct:+.1f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: mlp,gpt")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--microbatches", default="4,8,16")
    parser.add_argument("--calibrate-on", default="1f1b:8,interleaved:8",
                        help="SCHEDULE:M entries, comma-separated (the figure shows the first)")
    parser.add_argument("--calibration-steps", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="runs per held-out case (median taken)")
    parser.add_argument("--max-others", type=float, default=0.05, help="largest CPU share of other processes kept")
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--pause", type=float, default=10.0, help="seconds to wait before a retry")
    parser.add_argument("--wait", type=float, default=120.0,
                        help="seconds to wait for an idle machine before each run (then run anyway)")
    parser.add_argument("--reuse", action="store_true", help="read complete run directories instead of rerunning")
    parser.add_argument("--out", default="runs/validate")
    parser.add_argument("--figure", default="figures/sim_vs_measured.png")
    args = parser.parse_args(argv)
    args.schedules = args.schedules.split(",")
    args.microbatches = [int(x) for x in args.microbatches.split(",")]
    args.calibrate_on = args.calibrate_on.split(",")
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    rows = []
    for name in args.models.split(","):
        rows += validate_model(name, args)
    table = pd.DataFrame(rows)
    out = Path(args.out)
    table.to_csv(out / "results.csv", index=False)
    groups = table.groupby(["model", "calibration"], sort=False)
    summary = {
        "mape_pct": {f"{m} ({c})": float(g["error_pct"].abs().mean()) for (m, c), g in groups},
        "max_abs_error_pct": {f"{m} ({c})": float(g["error_pct"].abs().max()) for (m, c), g in groups},
        "rankings": rankings(table),
        "command": " ".join(["python", Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.figure:
        plot(table, Path(args.figure))
    print(markdown(table))
    print()
    for key, mape in summary["mape_pct"].items():
        print(f"{key}: MAPE {mape:.2f}% (largest |error| {summary['max_abs_error_pct'][key]:.2f}%)")
    for r in summary["rankings"]:
        verdict = "same order" if r["same"] else "DIFFERENT order"
        rounds = "rounds agree" if r["rounds_agree"] else "rounds disagree: " + ", ".join(
            " < ".join(o) for o in r["round_orders"])
        pairs = "; ".join(f"{p['faster']} < {p['slower']} ({'predicted' if p['predicted_same'] else 'NOT predicted'})"
                          for p in r["significant_pairs"]) or "none"
        print(f"{r['model']} ({r['calibration']}) m={r['microbatches']}: measured {' < '.join(r['measured_order'])}; "
              f"predicted {' < '.join(r['predicted_order'])} ({verdict}); {rounds}; "
              f"differences beyond the runs' spread: {pairs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
