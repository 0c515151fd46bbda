"""Simulated vs measured: calibrate on one executor run, predict held-out runs, table and figure.

Run (about 5 minutes on 2 cores; run it when the machine is otherwise idle):

    python bench/validate_sim.py --out runs/validate --figure figures/sim_vs_measured.png

Per model (``mlp`` and ``gpt``, sizes in MODELS) it

1. runs ``torchrun --nproc-per-node 2 -m runtime`` once for calibration (1F1B, m=8, with
   ``--profile-layers --profile-p2p``) and fits a `sim.calibration.Calibration` to it;
2. predicts, from that calibration alone, the median step time of gpipe, 1f1b and
   interleaved (v=2) at each m: the schedule is built and simulated under
   ``calibration.cost_model(num_stages)`` before the held-out run is made;
3. runs each held-out case on the executor (fresh runs; the calibration run is not one
   of them) and compares measured and predicted median step time.

The microbatch size is fixed (batch size = rows x m), so per-microbatch costs are the
same in every case. Every run posts receives one compute action ahead
(``--post-ahead 1``), the setting the simulator's transfer model describes (a transfer
starts when it is sent). While a run executes, the CPU time that other processes take
is measured from /proc/stat; a run during which others took more than --max-others of
the machine is repeated (up to --retries times, keeping the least disturbed try) and the
share is reported either way;
before each run it waits (up to --wait seconds) for the machine to be idle.

Writes OUT/results.csv (one row per case), OUT/summary.json (MAPE per model, ranking
agreement) and the figure; prints a markdown table.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

import schedules  # noqa: E402
from sim import simulate  # noqa: E402
from sim.calibration import calibrate  # noqa: E402
from sim.measured import read_measured  # noqa: E402

# Sizes where compute dominates the executor's fixed costs and one step takes 0.1-0.6 s.
MODELS = {
    "mlp": {"flags": ["--model", "mlp", "--layers", "8", "--hidden", "512"], "rows": 256},
    "gpt": {"flags": ["--model", "gpt", "--layers", "8", "--hidden", "192", "--heads", "6", "--seq-len", "64",
                      "--vocab", "512"], "rows": 16},
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


def launch(out: Path, schedule: str, m: int, model: dict, steps: int, warmup: int, profile: bool) -> dict:
    """One executor run; returns its wall time and the share of the machine others used meanwhile."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(RANKS), "--log-dir", str(out / "logs"),
        "-m", "runtime", "--schedule", schedule, "--microbatches", str(m), *model["flags"],
        "--batch-size", str(model["rows"] * m), "--steps", str(steps), "--warmup", str(warmup),
        "--post-ahead", "1", "--out", str(out),
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
    return {"wall": wall, "others": max(busy - mine, 0.0) / (wall * os.cpu_count())}


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


def measured_run(out: Path, schedule: str, m: int, model: dict, args, profile: bool = False) -> tuple:
    """Run until others took at most --max-others of the machine; after --retries more tries,
    keep the try they disturbed least."""
    tries = []
    for attempt in range(args.retries + 1):
        wait_quiet(args.wait, args.max_others)
        where = out.with_name(f"{out.name}.try{attempt}")
        if where.exists():
            shutil.rmtree(where)
        info = launch(where, schedule, m, model, args.steps, args.warmup, profile)
        tries.append((info["others"], attempt, where, info))
        if info["others"] <= args.max_others:
            break
        print(f"  {out.name}: other processes took {100 * info['others']:.0f}% of the CPUs"
              + (", retrying" if attempt < args.retries else ""), file=sys.stderr)
        time.sleep(args.pause)
    _, _, best, info = min(tries)
    if out.exists():
        shutil.rmtree(out)
    best.rename(out)
    for _, _, where, _ in tries:
        if where.exists():
            shutil.rmtree(where)
    return read_measured(out), info


def predict(calibration, schedule: str, m: int) -> float:
    built = schedules.build(schedule, ranks=RANKS, microbatches=m, chunks=CHUNKS.get(schedule))
    return simulate(built, calibration.cost_model(built.num_stages)).step_time


def validate_model(name: str, args) -> list[dict]:
    model = MODELS[name]
    root = Path(args.out) / name
    cal_dir = root / f"calibration-{args.calibrate_on}-m{args.calibrate_m}"
    print(f"{name}: calibration run ({args.calibrate_on}, m={args.calibrate_m})", file=sys.stderr)
    cal_run, cal_info = measured_run(cal_dir, args.calibrate_on, args.calibrate_m, model, args, profile=True)
    calibration = calibrate(cal_run)
    calibration.to_json(root / "costs.json")
    rows = []
    for m in args.microbatches:
        for schedule in args.schedules:
            predicted = predict(calibration, schedule, m)
            out = root / f"{schedule}-m{m}"
            run, info = measured_run(out, schedule, m, model, args)
            measured = run.step_time_median
            rows.append({
                "model": name, "schedule": schedule, "microbatches": m, "chunks": CHUNKS.get(schedule, 1),
                "measured_ms": 1e3 * measured, "predicted_ms": 1e3 * predicted,
                "error_pct": 100 * (predicted - measured) / measured,
                "others_cpu_pct": 100 * info["others"], "run": str(out),
            })
            print(f"  {schedule:12} m={m:<3} measured {1e3 * measured:8.1f} ms  predicted {1e3 * predicted:8.1f} ms  "
                  f"error {rows[-1]['error_pct']:+5.1f}%  (others {100 * info['others']:.0f}% CPU)", file=sys.stderr)
    return rows


def rankings(table: pd.DataFrame) -> list[dict]:
    """Per model and m: schedules ordered by measured and by predicted step time."""
    out = []
    for (model, m), group in table.groupby(["model", "microbatches"], sort=False):
        measured = list(group.sort_values("measured_ms")["schedule"])
        predicted = list(group.sort_values("predicted_ms")["schedule"])
        out.append({"model": model, "microbatches": int(m), "measured_order": measured,
                    "predicted_order": predicted, "same": measured == predicted})
    return out


def plot(table: pd.DataFrame, path: Path) -> None:
    """Per model: measured (filled, solid) and predicted (open, dashed) step time against m."""
    from matplotlib.figure import Figure

    from sim.plot_figures import shrink_png
    from sim.plot_style import OKABE_ITO

    colours = {"gpipe": OKABE_ITO["blue"], "1f1b": OKABE_ITO["orange"], "interleaved": OKABE_ITO["bluish_green"]}
    models = list(dict.fromkeys(table["model"]))
    fig = Figure(figsize=(4.0 * len(models), 3.3), layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        part = table[table["model"] == model]
        for schedule, rows in part.groupby("schedule", sort=False):
            rows = rows.sort_values("microbatches")
            colour = colours.get(schedule, OKABE_ITO["black"])
            ax.plot(rows["microbatches"], rows["measured_ms"], "o-", color=colour, label=f"{schedule} measured")
            ax.plot(rows["microbatches"], rows["predicted_ms"], "s--", color=colour, markerfacecolor="white",
                    label=f"{schedule} predicted")
        mape = part["error_pct"].abs().mean()
        ax.set_title(f"{model}: MAPE {mape:.1f}% over {len(part)} held-out runs", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(part["microbatches"].unique()), labels=[str(m) for m in sorted(part["microbatches"].unique())])
        ax.set_xlabel("microbatches m (fixed microbatch size)")
        ax.set_ylabel("median step time (ms)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, frameon=False)
    fig.suptitle("Simulator calibrated on one 1F1B run (m=8) vs executor, 2 ranks, gloo on CPU", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    shrink_png(path)


def markdown(table: pd.DataFrame) -> str:
    lines = ["| model | schedule | m | measured (ms) | predicted (ms) | error |", "|---|---|---:|---:|---:|---:|"]
    for r in table.itertuples():
        lines.append(f"| {r.model} | {r.schedule} | {r.microbatches} | {r.measured_ms:.1f} | {r.predicted_ms:.1f} | "
                     f"{r.error_pct:+.1f}% |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: mlp,gpt")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--microbatches", default="4,8,16")
    parser.add_argument("--calibrate-on", default="1f1b")
    parser.add_argument("--calibrate-m", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-others", type=float, default=0.05, help="largest CPU share of other processes kept")
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--pause", type=float, default=10.0, help="seconds to wait before a retry")
    parser.add_argument("--wait", type=float, default=120.0,
                        help="seconds to wait for an idle machine before each run (then run anyway)")
    parser.add_argument("--out", default="runs/validate")
    parser.add_argument("--figure", default="figures/sim_vs_measured.png")
    args = parser.parse_args(argv)
    args.schedules = args.schedules.split(",")
    args.microbatches = [int(x) for x in args.microbatches.split(",")]
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    rows = []
    for name in args.models.split(","):
        rows += validate_model(name, args)
    table = pd.DataFrame(rows)
    out = Path(args.out)
    table.to_csv(out / "results.csv", index=False)
    summary = {
        "mape_pct": {m: float(g["error_pct"].abs().mean()) for m, g in table.groupby("model", sort=False)},
        "max_abs_error_pct": {m: float(g["error_pct"].abs().max()) for m, g in table.groupby("model", sort=False)},
        "rankings": rankings(table),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.figure:
        plot(table, Path(args.figure))
    print(markdown(table))
    for model, mape in summary["mape_pct"].items():
        print(f"\n{model}: MAPE {mape:.2f}% (largest |error| {summary['max_abs_error_pct'][model]:.2f}%)")
    for r in summary["rankings"]:
        verdict = "same order" if r["same"] else "DIFFERENT order"
        print(f"{r['model']} m={r['microbatches']}: measured {' < '.join(r['measured_order'])}; "
              f"predicted {' < '.join(r['predicted_order'])} ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
