"""Peak activation bytes, simulated vs measured, on every shape of the fidelity sweep.

Per group of bench/fidelity.py (model, rows per microbatch, p): one 1F1B run at m = 2p with
``--profile-layers`` is calibrated alone; every schedule of the sweep then runs for real at
m = p and m = 4p (one step, no warm-up: the saved-tensor meter's bytes do not vary between
steps) and is simulated from that calibration. Byte counts are deterministic, so the target
is equality per rank, not an error bound. Prints one line per case and the count of ranks
whose peak is exact, per schedule; writes OUT/peak_bytes.csv.

    python bench/peak_bytes.py --out runs/peak-bytes [--groups mlp-8-p2 gpt-8-p4 ...] [--reuse]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pandas as pd  # noqa: E402

from fidelity import GROUPS, LOCK, SCHEDULES, CpuLock, group_name, run_case  # noqa: E402
from sim import simulate  # noqa: E402
from sim.calibration import calibrate  # noqa: E402
from sim.measured import read_measured  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--groups", nargs="*", default=None, help="group names (default: all of bench/fidelity.py)")
    parser.add_argument("--reuse", action="store_true", help="keep runs already made")
    args = parser.parse_args()
    known = {group_name(*g): g for g in GROUPS}
    unknown = sorted(set(args.groups or ()) - set(known))
    if unknown:
        print(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    lock = CpuLock(LOCK)
    rows = []
    for name in args.groups or list(known):
        model, mb_rows, p = known[name]
        base = args.out / name
        try:
            calibration = calibrate(read_measured(run_case(base / "calibrate-1f1b", model, mb_rows, p, "1f1b", 2 * p,
                                                           1, 0, True, args.reuse, lock)))
            for schedule in SCHEDULES:
                for m in (p, 4 * p):
                    run = read_measured(run_case(base / f"{schedule}-m{m}", model, mb_rows, p, schedule, m, 1, 0,
                                                 False, args.reuse, lock))
                    simulated = simulate(run.program, calibration.for_run(run)).peak_activation_bytes
                    measured = run.summary["peak_activation_bytes"]
                    for rank, (s, b) in enumerate(zip(simulated, measured)):
                        rows.append({"group": name, "schedule": schedule, "m": m, "rank": rank, "measured": b,
                                     "simulated": s})
                    print(f"{name:11s} {schedule:11s} m={m:<2d} measured {measured} simulated {simulated}"
                          f"{'' if simulated == measured else '  MISS'}", flush=True)
        finally:
            lock.release()
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "peak_bytes.csv", index=False)
    table["exact"] = table["measured"] == table["simulated"]
    table["error"] = (table["simulated"] - table["measured"]) / table["measured"]
    summary = table.groupby("schedule", sort=False).agg(exact=("exact", "sum"), ranks=("exact", "size"),
                                                        worst=("error", lambda e: e.abs().max()))
    print(summary.to_string(formatters={"worst": "{:.1%}".format}))
    print(f"all: {int(table['exact'].sum())} of {len(table)} ranks exact")
    return 0 if table["exact"].all() else 1


if __name__ == "__main__":
    sys.exit(main())
