"""Does processor sharing describe ranks that share cores? A check on measured runs.

    python bench/processor_sharing.py RUN_DIR [RUN_DIR ...]

A CPU run with more ranks on its host than cores (4 ranks on 2 cores) is calibrated and
simulated under processor sharing among the ranks' *compute*: while k actions compute, each
advances at min(1, cores / k) of its own speed, and ranks between compute actions take no
processor (sim.engine, Processors; sim.calibration.full_speed). If that holds, an action's
own-core time estimated that way (`full_speed`) does not depend on how many ranks computed
beside it. This prints, per run and kind, the median of each action's own-core estimate over its
stage and kind's median, by the concurrency its span saw (its wall time over its own-core
estimate, times the cores: up to the cores c, about 1.25c, 1.5c, 2c), and the demand `u` of a rank that is not
in a compute row that would explain the top bin against the bottom one: if such a rank takes a
share u of a core (the executor's own work between actions, a receive that polls), an action
among k computing ranks of R runs at min(1, cores / (k + u (R - k))), and the top bin's
estimates come out c / (c + u (R - c)) of the bottom's (shown for runs of R = 2c ranks, e.g.
4 on 2 cores, whose top bin is every rank computing). u near 0: processor sharing holds; near 1:
every rank competes for the cores all the time.

A run with cpu.csv (each compute action's thread CPU time, runtime/record.py) is checked
directly as well, with no law assumed. Per rank: the speed of its compute (its actions' CPU
time over their wall time, all steps), which needs no clock alignment; with ``--costs CAL.json``
beside it the model's (the calibration's own-core work for the run's program over the compute
wall time of its replay without spreads, at the calibration's idle share). Per number of compute
rows running over an action's span (its mean, rounded; on the run's one clock where it has
one, summary.json's ``clocks``; on rank clocks, aligned at the step's barrier only, which at p=4
leaves them 1-3 ms apart, the bins of short actions blur), the
measured speed beside processor sharing's min(1, cores / k). And the whole run's CPU
(summary.json's process_cpu_seconds: every thread of every rank) over the cores' time, and per
rank the share of a core its process took while not in a compute row (the transport's threads
and the executor's own work: what the idle share models).

    python bench/processor_sharing.py RUN_DIR [RUN_DIR ...] [--costs CAL.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sim.calibration import COMPUTE_NAMES, full_speed, host_ranks, shared_cores  # noqa: E402
from sim.measured import thread_cpu  # noqa: E402
from schedules import ScheduleError  # noqa: E402
from schedules.io import read_json  # noqa: E402
from sim import simulate  # noqa: E402
from sim.calibration import Calibration  # noqa: E402
from sim.costs import SPREADS, CostError  # noqa: E402
from sim.measured import read_measured  # noqa: E402

BINS = [0.0, 1.1, 1.45, 1.75, np.inf]  # mean concurrency over an action's span, in cores
LABELS = ["<=c", "~1.25c", "~1.5c", "~2c"]


def concurrency_table(timeline: pd.DataFrame, cores: int) -> pd.DataFrame:
    """Per kind and concurrency bin of a shared-core run's compute rows (`timeline`: step,
    stage, kind, start, end): the median own-core estimate over its (stage, kind) median, and
    the count."""
    rows = timeline[timeline["kind"].isin(COMPUTE_NAMES)].reset_index(drop=True)
    own = full_speed(rows["step"].to_numpy(), rows["start"].to_numpy(), rows["end"].to_numpy(), cores)
    wall = (rows["end"] - rows["start"]).to_numpy()
    keep = own > 0
    frame = rows[keep].assign(own=own[keep], concurrency=wall[keep] / own[keep])  # in cores
    frame["relative"] = frame["own"] / frame.groupby(["stage", "kind"])["own"].transform("median")
    frame["bin"] = pd.cut(frame["concurrency"], BINS, labels=LABELS)
    return frame.groupby(["kind", "bin"], observed=True)["relative"].agg(["median", "count"])


def idle_demand(cells: pd.DataFrame, cores: int, ranks: int) -> float | None:
    """`u` (module docstring) from one kind's bins; None unless the run has 2 x cores ranks and
    both end bins hold actions."""
    if ranks != 2 * cores or LABELS[0] not in cells.index or LABELS[-1] not in cells.index:
        return None
    ratio = cells.loc[LABELS[-1], "median"] / cells.loc[LABELS[0], "median"]
    return (1 / ratio - 1) * cores / (ranks - cores)


def cpu_rows(run) -> pd.DataFrame:
    """The run's compute rows (timeline index kept) with each one's thread CPU seconds from
    cpu.csv (`sim.measured.thread_cpu`)."""
    seconds = thread_cpu(run.timeline, run.cpu)
    return run.timeline.loc[seconds.index].assign(thread_cpu=seconds)


def measured_speed(run, cores: int) -> pd.DataFrame:
    """Per concurrency k (compute rows running over an action's span, its mean rounded, itself
    included): actions, their CPU time over their wall time, and processor sharing's speed."""
    rows = cpu_rows(run).reset_index(drop=True)
    wall = (rows["end"] - rows["start"]).to_numpy()
    running = np.zeros(len(rows))
    for _, here in rows.groupby("step").groups.items():
        a, b = rows.loc[here, "start"].to_numpy(), rows.loc[here, "end"].to_numpy()
        overlap = np.clip(np.minimum(b[:, None], b[None, :]) - np.maximum(a[:, None], a[None, :]), 0.0, None)
        running[here] = overlap.sum(axis=1) / np.maximum(b - a, 1e-12)
    frame = rows.assign(wall=wall, k=np.maximum(np.rint(running), 1).astype(int))[wall > 0]
    table = frame.groupby("k").agg(actions=("wall", "size"), cpu=("thread_cpu", "sum"), wall=("wall", "sum"))
    table["speed"] = table["cpu"] / table["wall"]
    table["processor_sharing"] = [min(1.0, cores / k) for k in table.index]
    return table[["actions", "speed", "processor_sharing"]]


def rank_speed(timeline: pd.DataFrame, own: pd.Series) -> list[float]:
    """Per rank of `timeline`: the own-core time of its compute rows (`own`, aligned with the
    timeline's index: measured CPU, or a model's cost) over their wall time."""
    compute = timeline[timeline["kind"].isin(COMPUTE_NAMES)]
    wall = (compute["end"] - compute["start"]).groupby(compute["rank"]).sum()
    return [float(x) for x in (own.loc[compute.index].groupby(compute["rank"]).sum() / wall).sort_index()]


def measured_rank_speed(run) -> list[float]:
    """Per rank, its compute actions' measured CPU time over their wall time, all steps."""
    return rank_speed(run.timeline, cpu_rows(run)["thread_cpu"])


def model_rank_speed(run, calibration) -> list[float]:
    """Per rank, the model's speed for the run's program (`measured_rank_speed`'s counterpart):
    the calibration's own-core cost of each compute row over its wall time in a replay without
    spreads, both with the loop's dispatch gap that the engine's rows hold."""
    costs = dataclasses.replace(calibration.for_run(run), **{name: () for name in SPREADS})
    shared = simulate(run.program, costs).timeline
    alone = simulate(run.program, dataclasses.replace(costs, cores=None)).timeline
    return rank_speed(shared, (alone["end"] - alone["start"]).set_axis(shared.index))


def off_compute_share(run) -> tuple[float, list[float]]:
    """(every rank's process CPU over the cores' time, median over steps; per rank, its
    process's CPU outside compute rows over its wall time outside them, median over steps)."""
    process = np.array(run.summary["process_cpu_seconds"])  # rank x step
    steps = np.array(run.step_times)
    cores = shared_cores(run)
    compute = run.timeline[run.timeline["kind"].isin(COMPUTE_NAMES)]
    cells = pd.MultiIndex.from_product([range(process.shape[0]), range(process.shape[1])])  # a rank idle all step: 0

    def per_rank_and_step(values: pd.Series) -> np.ndarray:
        return values.reindex(cells, fill_value=0.0).to_numpy().reshape(process.shape)

    busy = per_rank_and_step((compute["end"] - compute["start"]).groupby([compute["rank"], compute["step"]]).sum())
    cpu = per_rank_and_step(run.cpu.groupby(["rank", "step"])["thread_cpu"].sum())
    shares = np.median((process - cpu) / np.maximum(steps[None, :] - busy, 1e-12), axis=1)
    return float(np.median(process.sum(axis=0) / (cores * steps))), [float(x) for x in shares]


def read_shared(path: str):
    """A measured run (sim.measured.MeasuredRun), the cores and the ranks on its host;
    ValueError unless they shared cores."""
    run = read_measured(path)
    cores = shared_cores(run)
    if cores is None:
        raise ValueError(f"{path}: its ranks did not share cores (summary.json's cpu_cores, local_world_size)")
    return run, cores, host_ranks(run)


@dataclasses.dataclass(frozen=True)
class CpuCheck:
    """What one run's CPU table says (module docstring): its speed by concurrency, all ranks'
    CPU over the cores' time, each rank's off-compute share of a core, and each rank's compute
    speed, measured and (with a calibration) the model's."""

    path: str
    by_concurrency: pd.DataFrame
    all_cpu: float
    off_compute: list[float]
    rank_speed: list[float]
    model_rank_speed: list[float] | None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--costs", metavar="CAL.json", help="a calibration (sim calibrate) whose speed per rank to show "
                        "beside the measured one")
    args = parser.parse_args()
    tables, measured = [], []
    try:
        calibration = Calibration.from_dict(read_json(Path(args.costs)), args.costs) if args.costs else None
        for path in args.runs:
            run, cores, ranks = read_shared(path)
            tables.append((path, concurrency_table(run.timeline, cores), cores, ranks))
            if run.cpu is not None and "process_cpu_seconds" in run.summary:
                modelled = model_rank_speed(run, calibration) if calibration is not None else None
                used, shares = off_compute_share(run)
                measured.append(CpuCheck(path, measured_speed(run, cores), used, shares, measured_rank_speed(run),
                                         modelled))
    except (OSError, ValueError, ScheduleError, CostError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("| run | kind | " + " | ".join(f"k {b} (n)" for b in LABELS) + " | u |")
    print("|---|---|" + "---:|" * (len(LABELS) + 1))
    for path, table, cores, ranks in tables:
        for kind in table.index.get_level_values("kind").unique():
            cells = table.loc[kind]
            shown = [f"{cells.loc[b, 'median']:.2f} ({cells.loc[b, 'count']})" if b in cells.index else "" for b in LABELS]
            u = idle_demand(cells, cores, ranks)
            print(f"| {Path(path).name} | {kind} | " + " | ".join(shown) + f" | {'' if u is None else f'{u:.2f}'} |")
    if measured:
        top = max(int(check.by_concurrency.index.max()) for check in measured)
        print()
        print("| run | " + " | ".join(f"k={k}: speed (processor sharing; actions)" for k in range(1, top + 1))
              + " | all CPU / cores' time | off-compute share of a core per rank |")
        print("|---|" + "---:|" * (top + 2))
        for check in measured:
            table = check.by_concurrency
            cells = [f"{table.loc[k, 'speed']:.2f} ({table.loc[k, 'processor_sharing']:.2f}; {table.loc[k, 'actions']})"
                     if k in table.index else "" for k in range(1, top + 1)]
            print(f"| {Path(check.path).name} | " + " | ".join(cells) + f" | {check.all_cpu:.2f} | "
                  + ", ".join(f"{x:.2f}" for x in check.off_compute) + " |")
        print()
        print("| run | speed per rank, measured (CPU / wall) |" + (" the model's |" if calibration else ""))
        print("|---|---|" + ("---|" if calibration else ""))
        for check in measured:
            print(f"| {Path(check.path).name} | " + " ".join(f"{x:.2f}" for x in check.rank_speed) + " |"
                  + (" " + " ".join(f"{x:.2f}" for x in check.model_rank_speed) + " |"
                     if check.model_rank_speed is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
