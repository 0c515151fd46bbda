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
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sim.calibration import COMPUTE_NAMES, full_speed, host_ranks, shared_cores  # noqa: E402
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


def read_shared(path: str) -> tuple[pd.DataFrame, int, int]:
    """A measured run's timeline, cores and ranks on its host; ValueError unless they shared cores."""
    run = read_measured(path)
    cores = shared_cores(run)
    if cores is None:
        raise ValueError(f"{path}: its ranks did not share cores (summary.json's cpu_cores, local_world_size)")
    return run.timeline, cores, host_ranks(run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    tables = []
    for path in args.runs:
        try:
            timeline, cores, ranks = read_shared(path)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        tables.append((path, concurrency_table(timeline, cores), cores, ranks))
    print("| run | kind | " + " | ".join(f"k {b} (n)" for b in LABELS) + " | u |")
    print("|---|---|" + "---:|" * (len(LABELS) + 1))
    for path, table, cores, ranks in tables:
        for kind in table.index.get_level_values("kind").unique():
            cells = table.loc[kind]
            shown = [f"{cells.loc[b, 'median']:.2f} ({cells.loc[b, 'count']})" if b in cells.index else "" for b in LABELS]
            u = idle_demand(cells, cores, ranks)
            print(f"| {Path(path).name} | {kind} | " + " | ".join(shown) + f" | {'' if u is None else f'{u:.2f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
