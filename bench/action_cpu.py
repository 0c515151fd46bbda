"""Do the same actions cost the same CPU in every run? A check on measured runs' thread CPU time.

    python bench/action_cpu.py RUN_DIR [RUN_DIR ...]

Every cost model prices an action by its stage and kind (plus its place, a switch and a run of
repeats), the same in every program. A run's cpu.csv (runtime/record.py: each compute action's
thread CPU time) says what an action cost its thread whatever the other ranks did, with no clock
alignment and no law of shared cores assumed. This prints:

- per run: its microbatches, its compute actions, their mean CPU over the median of their rank,
  stage and kind over *all* the runs given (1.00 where every run's actions cost alike; a run
  whose actions cost more comes out above), the compute CPU and the rest of the processes' CPU
  (summary.json's process_cpu_seconds less the compute: the transport's threads, the executor's
  own work) per microbatch, and all of it over the host's cores' time (how busy the cores were);
- per repeat (an action of the same stage and kind as its rank's previous compute action in
  the step) or switch, by the gap since that previous action ended: the median CPU over the
  same pooled medians (where ranks share cores, other ranks run in a waiting rank's gap and
  evict its caches).

bench/fidelity_sweeps.md's "Sweep 18" quotes it for mlp 8 rows at p=4 against p=2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from schedules import ScheduleError  # noqa: E402
from sim.measured import read_measured  # noqa: E402

GAPS = [0.0, 50e-6, 200e-6, 500e-6, 1e-3, np.inf]  # seconds since the rank's previous compute action ended
GAP_LABELS = ["<50us", "50-200us", "0.2-0.5ms", "0.5-1ms", ">1ms"]


def action_rows(run) -> pd.DataFrame:
    """The run's compute rows that cpu.csv holds: step, rank, stage, kind, thread CPU seconds, the
    gap since the rank's previous compute row of the step ended (NaN for its first) and whether
    that row was of the same stage and kind (a repeat)."""
    seconds = run.thread_cpu
    if seconds is None:
        raise ValueError(f"{run.path}: no cpu.csv (a run from before the executor recorded thread CPU time)")
    rows = run.timeline.loc[seconds.index, ["step", "rank", "stage", "kind", "start", "end"]].assign(cpu=seconds)
    rows = rows.sort_values(["step", "rank", "start"])
    before = rows.groupby(["step", "rank"])
    rows["gap"] = rows["start"] - before["end"].shift(1)
    rows["repeat"] = (before["kind"].shift(1) == rows["kind"]) & (before["stage"].shift(1) == rows["stage"])
    return rows


def relative(frames: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """Each frame (`action_rows`) with `rel`: its CPU over the median of its rank, stage and kind
    over all the frames together."""
    pooled = pd.concat(frames).groupby(["rank", "stage", "kind"])["cpu"].median().rename("pooled")
    return [f.join(pooled, on=["rank", "stage", "kind"]).assign(rel=lambda f: f["cpu"] / f["pooled"]) for f in frames]


def run_line(run, rows: pd.DataFrame) -> dict:
    """One run's row of the first table (module docstring)."""
    m = int(run.summary["microbatches"])
    steps = int(rows["step"].nunique())
    compute = float(rows["cpu"].sum()) / steps
    line = {"m": m, "actions": len(rows), "cpu_over_pooled": float(rows["rel"].mean()),
            "compute_ms_per_microbatch": compute / m * 1e3}
    process = run.summary.get("process_cpu_seconds")
    cores = run.summary.get("cpu_cores")
    if process is not None:
        per_step = np.array(process, dtype=float).sum(axis=0)  # every rank's process, per measured step
        line["other_ms_per_microbatch"] = (float(np.mean(per_step)) - compute) / m * 1e3
        if cores:
            line["cores_busy"] = float(np.median(per_step / (cores * np.array(run.step_times))))
    return line


def gap_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Median `rel` and count of the rows (`relative` frames, pooled) by repeat and gap bin."""
    known = rows[rows["gap"].notna()]
    bins = pd.cut(known["gap"], GAPS, labels=GAP_LABELS, right=False)
    return known.groupby([known["repeat"], bins], observed=True)["rel"].agg(["median", "size"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    try:
        runs = [read_measured(path) for path in args.runs]
        frames = relative([action_rows(run) for run in runs])
        lines = [run_line(run, rows) for run, rows in zip(runs, frames)]
    except (OSError, ValueError, KeyError, ScheduleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("| run | m | compute actions | CPU over the pooled median | compute CPU per microbatch (ms) "
          "| other CPU per microbatch (ms) | all CPU over the cores' time |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for path, line in zip(args.runs, lines):
        other = line.get("other_ms_per_microbatch")
        busy = line.get("cores_busy")
        print(f"| {path} | {line['m']} | {line['actions']} | {line['cpu_over_pooled']:.3f} | "
              f"{line['compute_ms_per_microbatch']:.2f} | {'' if other is None else f'{other:.2f}'} | "
              f"{'' if busy is None else f'{busy:.2f}'} |")
    table = gap_table(pd.concat(frames))
    print()
    print("| action | " + " | ".join(f"gap {b}: CPU over pooled (n)" for b in GAP_LABELS) + " |")
    print("|---|" + "---:|" * len(GAP_LABELS))
    for repeat, name in ((True, "repeat"), (False, "switch")):
        cells = [f"{table.loc[(repeat, b), 'median']:.2f} ({table.loc[(repeat, b), 'size']})"
                 if (repeat, b) in table.index else "" for b in GAP_LABELS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
