"""Do the notes of sim.coverage pick out the predictions that miss? Measured on the standing.

    python bench/coverage_errors.py [bench/fidelity_standing.csv]

For each case of the fidelity standing (bench/fidelity_standing.py: one row per group,
schedule and m, measured and predicted), the programs of its calibrations are built again
(bench/fidelity.py: at the case's p, m = 2p, 1F1B alone for ``1f1b``; 1F1B, ZB-H1 and
interleaved with 2 chunks for ``three``) and `sim.coverage.beyond` says what the case's own
program holds beyond them (stage sizes left out: every group's cases hold the stage sizes of
its calibration runs). Prints, per calibration, the cases with and without a note: how many,
their mean |error|, how many within 5% and the largest error; then per topic of note
(`sim.coverage.Topic`) the cases it was given to, their mean |error| and mean error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import schedules  # noqa: E402
from sim.coverage import beyond, coverage_of  # noqa: E402

CALIBRATIONS = {"1f1b": (("1f1b", None),), "three": (("1f1b", None), ("zb-h1", None), ("interleaved", 2))}


def program(name: str, ranks: int, microbatches: int, chunks: int | None = None) -> schedules.Program:
    return schedules.lower(schedules.build(name, ranks=ranks, microbatches=microbatches, chunks=chunks))


def noted(frame: pd.DataFrame) -> pd.DataFrame:
    """Per case and calibration: its error and the notes its program gets."""
    rows = []
    for p in sorted(frame["p"].unique()):
        held = {name: coverage_of([program(s, int(p), 2 * int(p), v) for s, v in runs], [[]] * len(runs))
                for name, runs in CALIBRATIONS.items()}
        for case in frame[frame["p"] == p].itertuples():
            case_program = program(case.schedule, int(p), int(case.m))
            for name, coverage in held.items():
                notes = beyond(coverage, case_program, [])
                rows.append({"group": case.group, "schedule": case.schedule, "m": int(case.m), "calibration": name,
                             "error": getattr(case, f"err_{name}"), "notes": notes})
    return pd.DataFrame(rows)


def summary(cases: pd.DataFrame) -> pd.DataFrame:
    """Per calibration, cases with a note against those without."""
    out = []
    for (name, flagged), part in cases.groupby(["calibration", cases["notes"].map(bool)]):
        worst = part.loc[part["error"].abs().idxmax()]
        out.append({"calibration": name, "noted": "yes" if flagged else "no", "cases": len(part),
                    "mean |error|": f"{100 * part['error'].abs().mean():.1f}%",
                    "within 5%": f"{int((part['error'].abs() <= 0.05).sum())}/{len(part)}",
                    "largest": f"{100 * worst['error']:+.1f}% ({worst['group']} {worst['schedule']} m={worst['m']})"})
    return pd.DataFrame(out)


def markdown(frame: pd.DataFrame) -> str:
    """`frame` as a markdown table, every cell as text."""
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("standing", nargs="?", default="bench/fidelity_standing.csv")
    args = parser.parse_args(argv)
    try:
        frame = pd.read_csv(args.standing)
    except (OSError, pd.errors.ParserError) as exc:
        print(f"coverage_errors: cannot read {args.standing}: {exc}", file=sys.stderr)
        return 2
    cases = noted(frame)
    print(markdown(summary(cases)))
    print()
    kinds = cases.explode("notes").dropna(subset=["notes"])
    kinds["note"] = [note.topic.value for note in kinds["notes"]]
    table = kinds.groupby(["calibration", "note"])["error"].agg(
        cases="size", mean_abs=lambda e: f"{100 * e.abs().mean():.1f}%", mean=lambda e: f"{100 * e.mean():+.1f}%")
    print(markdown(table.reset_index()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
