"""Where each shape group stands: its latest sweep's held-out predictions, gathered into one table
and one figure.

    python bench/fidelity_standing.py RESULTS.csv:GROUP[,GROUP...] [...] [--calibration three] [--figure PATH] [--write CSV]
    python bench/fidelity_standing.py bench/fidelity_standing.csv --figure figures/fidelity_standing.png

Each argument names a sweep's results.csv (bench/fidelity.py) and the groups to take from it, so
that every group is shown from the sweep that measured it last; a file named without groups gives
all of its groups. ``--write`` keeps the gathered rows, each with the file it came from
(``source``), as one CSV: bench/fidelity_standing.csv is that table for the README, so that its
standing and figure are drawn again from the repository alone (run directories are not kept in
it); read back, its rows keep their own sources. It prints per group the MAPE of
the chosen calibration's predictions (default ``three``: the round's three calibration runs),
the largest error and the schedule pairs whose rounds do not overlap that it orders as measured
(bench/fidelity.py's `summarize`), and draws every case's error against its measured step time
(the rounds' range as the error's bar: what the machine's own variation spans).
The README's "Where each group stands" and its figure come from it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pandas as pd  # noqa: E402

from fidelity import summarize  # noqa: E402


def parse_source(text: str) -> tuple[Path, list[str] | None]:
    """'RESULTS.csv:GROUP,GROUP' -> (path, groups), 'RESULTS.csv' -> (path, None: every group);
    ValueError if a colon leaves either part empty."""
    if ":" not in text:
        return Path(text), None
    path, _, groups = text.rpartition(":")
    names = [g for g in groups.split(",") if g]
    if not path or not names:
        raise ValueError(f"expected RESULTS.csv[:GROUP[,GROUP...]], got {text!r}")
    return Path(path), names


def gather(sources: list[tuple[Path, list[str] | None]]) -> pd.DataFrame:
    """The named groups' rows of each results.csv (None: all of its groups), with the file each
    came from (a row that already names one, from a table ``--write`` wrote, keeps it);
    ValueError for a group a file lacks or a group named twice."""
    frames, seen = [], set()
    for path, names in sources:
        table = pd.read_csv(path)
        if "group" not in table.columns:
            raise ValueError(f"{path} is not a results table (it has no group column)")
        for name in (table["group"].unique().tolist() if names is None else names):
            if name in seen:
                raise ValueError(f"group {name} named twice")
            seen.add(name)
            rows = table[table["group"] == name]
            if rows.empty:
                raise ValueError(f"{path} has no group {name} (it has {', '.join(table['group'].unique())})")
            kept = rows["source"] if "source" in rows.columns else str(path)
            frames.append(rows.assign(source=kept))
    return pd.concat(frames, ignore_index=True)


def figure(table: pd.DataFrame, label: str, path: str) -> None:
    """Each case's error (predicted over measured, less 1) against its measured step time, a
    colour and marker per group (hollow where p > 2: ranks sharing the cores); the bar is the
    rounds' lowest to highest median seen from the prediction, and the band the 5% target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colours = plt.get_cmap("tab20").colors  # dark tones, then light ones: the fourteen groups stay apart
    for k, (name, g) in enumerate(table.groupby("group", sort=False)):
        predicted = g[f"pred_{label}_ms"]
        error = 100 * (predicted / g["measured_ms"] - 1)
        low, high = 100 * (predicted / g["q3_ms"] - 1), 100 * (predicted / g["q1_ms"] - 1)
        hollow = "p" in g and int(g["p"].iloc[0]) > 2  # ranks sharing the two cores
        ax.errorbar(g["measured_ms"], error, yerr=[error - low, high - error], fmt="s" if name.startswith("gpt") else "o",
                    ms=4, color=colours[(2 * k) % 20 + (k >= 10)], label=name, alpha=0.85, elinewidth=0.8,
                    mfc="white" if hollow else None)
    ax.axhspan(-5, 5, color="0.88", label="within 5%")
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xscale="log", xlabel="measured step time, ms (median of the rounds)",
           ylabel=f"error of the {label} calibration's prediction, %",
           title="held-out runs, every schedule, each group's latest sweep")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sources", nargs="+", metavar="RESULTS.csv[:GROUP[,GROUP...]]")
    parser.add_argument("--calibration", default="three", help="which predictions (results.csv's pred_*_ms)")
    parser.add_argument("--figure", metavar="PATH")
    parser.add_argument("--write", metavar="CSV", help="keep the gathered rows, with their sources, as one CSV")
    args = parser.parse_args()
    try:
        table = gather([parse_source(text) for text in args.sources])
        if f"err_{args.calibration}" not in table.columns or table[f"err_{args.calibration}"].isna().all():
            raise ValueError(f"no {args.calibration} predictions in the results given")
        summary = summarize(table)["groups"]
    except (OSError, ValueError, KeyError, pd.errors.ParserError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    label = args.calibration
    print(f"| group | from | cases | MAPE ({label}) | largest error | ordered as measured |")
    print("|---|---|---:|---:|---|---|")
    errors = []
    for name, g in table.groupby("group", sort=False):
        entry = summary[name].get(label)
        if entry is None:
            print(f"| {name} | {g['source'].iloc[0]} | 0 | | | |")
            continue
        errors += g[f"err_{label}"].dropna().abs().tolist()
        order = entry["ordering"]
        print(f"| {name} | {g['source'].iloc[0]} | {entry['cases']} | {entry['mape']:.1%} | "
              f"{entry['largest']:+.1%} ({entry['largest_case']}) | {order['agreed']}/{order['pairs']} |")
    within = sum(e <= 0.05 for e in errors)
    print(f"\n{len(errors)} cases: mean absolute error {sum(errors) / len(errors):.1%}, {within} within 5%")
    try:
        if args.figure:
            figure(table[table[f"err_{label}"].notna()], label, args.figure)
            print(f"wrote {args.figure}")
        if args.write:
            table.to_csv(args.write, index=False)
            print(f"wrote {args.write}")
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
