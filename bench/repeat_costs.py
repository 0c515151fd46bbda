"""What a compute action costs after a run of actions of its own stage and kind, measured vs modelled.

    python bench/repeat_costs.py RUN_DIR [RUN_DIR ...] [--calibrate-on RUN_DIR ...]

The simulator charges a compute action its stage's cost plus a switch cost when its rank's
previous compute action had another stage or kind, and from the third action of a run of
repeats on its stage cost times a repeat factor (sim.costs.repeat_factor: 1 where the
calibration's runs cannot tell the discount, as three runs at m = 2p cannot; a GPipe run can).
This prints, per run, kind and stage, the
in-run mean duration of the actions at place 2 or later (the third action of its stage and kind
in the step on, so that the first actions' own factors stay out) by **run length**: 1 (the
action switches: ``1 kind`` where the rank's previous compute action was of its own stage and
another kind, ``1 stage`` where it was of another stage, schedules.analysis.stage_switches), 2
(the second in a row) and 3 or more, each beside what the calibration of the run itself charges
for it (`sim calibrate`'s fit: the stage's cost, a split forward's where the run splits its
backward, times the repeat factor at the action's run length, plus the switch for run length
1; the model charges both kinds of switch alike). A 1F1B, ZB-H1 or interleaved run at m = 2p has
runs of length 1 and 2 only; a GPipe run has long ones; a rank holding two stages (interleaved,
the V-shapes) switches stage. README's "Repeated actions" and "Found at small microbatches, not
modelled" quote these numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from schedules.analysis import places, run_lengths, split_forwards, stage_switches  # noqa: E402
from schedules.errors import ScheduleError  # noqa: E402
from sim.calibration import Calibration, calibrate, calibrate_runs, compute_frame  # noqa: E402
from sim.costs import CostError, repeat_factor  # noqa: E402
from sim.measured import read_measured  # noqa: E402

FIRST_LATER_PLACE = 2


def repeat_table(path: str, calibration: Calibration | None) -> pd.DataFrame:
    """One row per (kind, stage, run-length class) of the run's later-place compute actions: count,
    measured mean (us), and the cost `calibration` (default: the run's own) charges for it (us)."""
    run = read_measured(path)
    calibration = calibration or calibrate(run)
    costs = calibration.for_run(run).for_schedule(run.program.schedule)
    per_kind = {"F": costs.forward, "B": costs.backward, "I": costs.input, "W": costs.weight}
    split = [split_forwards(s) for s in run.program.streams]  # priced at costs.forward_split
    frame = compute_frame(run, calibration.idle_share)  # on a core of its own under the model's share
    position = run.timeline.groupby(["step", "rank"]).cumcount().loc[frame.index].to_numpy()
    ranks = frame["rank"].to_numpy()
    lengths = [run_lengths(s) for s in run.program.streams]
    raw_places = [places(s) for s in run.program.streams]
    exact = [lengths[r][i] for r, i in zip(ranks, position)]
    other_stage = [stage_switches(s) for s in run.program.streams]
    frame["length"] = [("1 stage" if other_stage[r][i] else "1 kind") if k == 1 else "2" if k == 2 else "3+"
                       for r, i, k in zip(ranks, position, exact)]
    splits = [split[r][i] for r, i in zip(ranks, position)]
    discount = {"F": costs.repeat_discount_forward}
    # ns; the simulated action holds the loop's dispatch gap, which the measured row leaves out
    frame["modelled"] = [
        ((costs.forward_split if s else per_kind[kind])[stage]
         * repeat_factor(discount.get(kind, costs.repeat_discount_backward), k)
         + ((costs.switch_forward if kind == "F" else costs.switch_backward) if k == 1 else 0)) / 1e9
        for kind, stage, k, s in zip(frame["kind"], frame["stage"], exact, splits)]
    frame = frame[[raw_places[r][i] >= FIRST_LATER_PLACE for r, i in zip(ranks, position)]]
    dispatch = calibration.dispatch_overhead
    rows = []
    for (kind, stage, length), cell in frame.groupby(["kind", "stage", "length"]):
        rows.append({"run": Path(path).name, "kind": kind, "stage": int(stage),
                     "length": length, "actions": len(cell),
                     "measured_us": 1e6 * float(cell["duration"].mean()),
                     "modelled_us": 1e6 * (float(cell["modelled"].mean()) - dispatch)})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories to tabulate")
    parser.add_argument("--calibrate-on", nargs="+", default=None,
                        help="model every run with the calibration of these runs (default: each run's own)")
    args = parser.parse_args()
    try:
        shared = calibrate_runs([read_measured(p) for p in args.calibrate_on]) if args.calibrate_on else None
        tables = [repeat_table(path, shared) for path in args.runs]
    except (ScheduleError, CostError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    table = pd.concat(tables, ignore_index=True)
    if table.empty:
        print(f"error: no run holds compute actions at place {FIRST_LATER_PLACE} or later (m >= 3 needed)",
              file=sys.stderr)
        return 1
    print("| run | kind | stage | run length | actions | measured us | modelled us | measured / modelled |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for r in table.itertuples():
        print(f"| {r.run} | {r.kind} | {r.stage} | {r.length} | {r.actions} | {r.measured_us:.0f} | "
              f"{r.modelled_us:.0f} | x{r.measured_us / r.modelled_us:.2f} |")
    print()
    print("| run | kind | run length | actions | measured / modelled, all stages |")
    print("|---|---|---|---:|---:|")
    for (run, kind, length), cell in table.groupby(["run", "kind", "length"], sort=False):
        ratio = (cell["measured_us"] * cell["actions"]).sum() / (cell["modelled_us"] * cell["actions"]).sum()
        print(f"| {run} | {kind} | {length} | {cell['actions'].sum()} | x{ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
