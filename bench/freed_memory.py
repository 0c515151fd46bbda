"""What handing freed activations back to the operating system costs a CPU step (runtime/allocator.py).

    python bench/freed_memory.py --out runs/freed-memory

Runs GPipe and 1F1B at the same m (GPipe holds m microbatches' activations per rank, 1F1B at
most p), each with ``--freed-memory keep`` and ``release``, in turn, --rounds times (a launch
each: the allocator is set per process), and prints per run the median step time, the peak
activation bytes and the page faults per step (the children's minor faults over the launch,
divided by its steps), then, per round and as the median and range over rounds, GPipe's step
over 1F1B's under each setting and keep's over release's per schedule. If activations
held made compute slower by themselves, GPipe / 1F1B would stay up with memory kept; if the cost
is the kernel mapping freed memory again every step, it falls to about 1.

Defaults: gpt (8 layers, hidden 128, 4 heads, 64 tokens, vocabulary 256) with 256 rows per
microbatch, p = 2, m = 8: about 4.6 GB of activations per rank under GPipe, 1.1 GB under 1F1B.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCHEDULES = ("gpipe", "1f1b")
SETTINGS = ("keep", "release")
MODEL = ["--model", "gpt", "--layers", "8", "--hidden", "128", "--heads", "4", "--seq-len", "64", "--vocab", "256"]


def launch(out: Path, schedule: str, setting: str, args: argparse.Namespace) -> dict:
    """One executor run; returns its step time, peak activation bytes and minor faults per step."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.p),
               "--standalone", "-m", "runtime", "--schedule", schedule,
               "--microbatches", str(args.m), *MODEL, "--batch-size", str(args.rows * args.m),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--freed-memory", setting, "--out", str(out)]
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    started = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"step": summary["step_time_median"], "peak": max(summary["peak_activation_bytes"]),
            "faults": (resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - faults) / (args.steps + args.warmup),
            "wall": time.time() - started, "freed_memory": summary.get("freed_memory")}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/freed-memory"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rows", type=int, default=256, help="rows per microbatch")
    parser.add_argument("--m", type=int, default=8, help="microbatches")
    parser.add_argument("--p", type=int, default=2, help="ranks")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "rows", "m", "p"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    results: list[dict[tuple[str, str], dict]] = []
    print("| round | schedule | freed memory | step s | peak activation GB per rank | minor faults per step | "
          "launch s |\n|---:|---|---|---:|---:|---:|---:|", flush=True)
    for r in range(args.rounds):
        found = {}
        # alternate the order between rounds, so that neither setting always runs on the warmer machine
        order = [(s, k) for s in SCHEDULES for k in (SETTINGS if r % 2 == 0 else SETTINGS[::-1])]
        for schedule, setting in order:
            try:
                run = launch(args.out / f"{schedule}-{setting}-r{r}", schedule, setting, args)
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            found[(schedule, setting)] = run
            print(f"| {r} | {schedule} | {run['freed_memory']} | {run['step']:.3f} | {run['peak'] / 1e9:.2f} | "
                  f"{run['faults']:.0f} | {run['wall']:.0f} |", flush=True)
        results.append(found)

    def ratios(a: tuple[str, str], b: tuple[str, str]) -> list[float]:
        return [found[a]["step"] / found[b]["step"] for found in results]

    print("\nratios of median step times (median over rounds, range):")
    for setting in SETTINGS:
        print(f"  GPipe / 1F1B with memory {setting}: {spread(ratios(('gpipe', setting), ('1f1b', setting)))}")
    for schedule in SCHEDULES:
        print(f"  {schedule}: keep / release: {spread(ratios((schedule, 'keep'), (schedule, 'release')))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
