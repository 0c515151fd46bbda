"""Data parallelism on this machine: pp=2 x dp=2 against pp=2 x dp=1 at the same global batch,
and held-out predictions of dp=2 runs from a dp=2 calibration.

    python bench/data_parallel.py --out runs/dp_bench [--rounds 3]

Per round, in this order (rounds repeat it, so slow spells hit every case):

- ``cal``: pp=2 x dp=2, 1F1B m=2, with --profile-layers --profile-p2p (the calibration run);
- ``dp2``: pp=2 x dp=2, 1F1B m=M (4 ranks, each pipeline gets half the batch);
- ``dp1``: pp=2 x dp=1, 1F1B m=2M (2 ranks, the whole batch through one pipeline);
- ``dp2-m8``: pp=2 x dp=2, 1F1B m=2M (twice the batch), held out like ``dp2``.

Every run has the same microbatch (ROWS samples), so dp2 and dp1 process the same global
batch of 2 M ROWS samples per step. Reported: each case's median step time per round, the
ratio dp2 / dp1 per round (median and range), and `sim compare --measured` of dp2 and dp2-m8
against the round's own calibration (signed error of the predicted step time).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROWS = 8
MODEL = ["--model", "mlp", "--layers", "8", "--hidden", "512"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(out: Path, dp: int, m: int, steps: int, profile: bool) -> dict:
    """One torchrun launch of the executor; returns its summary.json."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [torchrun, "--nproc-per-node", str(2 * dp), "--master-addr", "127.0.0.1", "--master-port", str(_port()),
           "-m", "runtime", "--schedule", "1f1b", "--microbatches", str(m), "--pp", "2", "--dp", str(dp),
           *MODEL, "--batch-size", str(ROWS * m * dp), "--steps", str(steps), "--warmup", "3",
           "--timeout", "120", "--out", str(out)]
    if profile:
        cmd += ["--profile-layers", "--profile-p2p"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def predict(run_dir: Path, costs: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "sim", "compare", "--measured", str(run_dir), "--costs", str(costs),
                           "--json"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"sim compare failed on {run_dir}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/dp_bench"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--microbatches", type=int, default=4, help="M: dp2's microbatches per pipeline")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    m = args.microbatches
    cases = {"cal": (2, 2, True), "dp2": (2, m, False), "dp1": (1, 2 * m, False), "dp2-m8": (2, 2 * m, False)}
    began = time.monotonic()
    rounds = []
    for r in range(args.rounds):
        medians, errors, calibration = {}, {}, None
        for name, (dp, micro, profile) in cases.items():
            out = args.out / f"round{r}" / name
            summary = run(out, dp, micro, args.steps, profile)
            medians[name] = summary["step_time_median"]
            if name == "cal":
                calibration = args.out / f"round{r}" / "costs.json"
                subprocess.run([sys.executable, "-m", "sim", "calibrate", str(out), "-o", str(calibration)],
                               check=True, capture_output=True, text=True, timeout=300)
            elif dp == 2:
                errors[name] = predict(out, calibration)["step_time_error"]
            print(f"round {r} {name}: {medians[name] * 1e3:.1f} ms", flush=True)
        rounds.append({"step_time_median": medians, "prediction_error": errors,
                       "ratio_dp2_over_dp1": medians["dp2"] / medians["dp1"]})
    ratios = [r["ratio_dp2_over_dp1"] for r in rounds]
    result = {
        "rows_per_microbatch": ROWS, "model": MODEL, "microbatches": m, "rounds": rounds,
        "ratio_median": median(ratios), "ratio_range": [min(ratios), max(ratios)],
        "seconds": time.monotonic() - began,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    for name in ("dp2", "dp1", "dp2-m8"):
        values = [r["step_time_median"][name] * 1e3 for r in rounds]
        line = f"{name}: median {median(values):.1f} ms (rounds {min(values):.1f}-{max(values):.1f})"
        if name != "dp1":
            errs = [r["prediction_error"][name] * 100 for r in rounds]
            line += f"; predicted step time error median {median(errs):+.1f}% (rounds {min(errs):+.1f}..{max(errs):+.1f}%)"
        print(line)
    print(f"dp2 / dp1 step time: median {result['ratio_median']:.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f}); "
          f"{result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
