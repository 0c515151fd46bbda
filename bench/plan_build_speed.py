"""Building, checking and lowering a program: this working tree against older commits, side by side.

For each shape, one timed call of the public path, `schedules.lower(schedules.build(...))`
(generate, check the rules, lower, check the program), in a fresh process per measurement
so nothing is cached. The code of each older commit is `git archive`d into a temporary
directory and run the same way; versions alternate within each repeat so that the shared
machine's load falls on all of them alike. Prints per shape and version the median and the
range over the repeats, the ratio of medians to this tree, and checks that every version
lowers every shape to the same program (SHA-256 of its text).

    python bench/plan_build_speed.py [--repeat 7] [--old 86e2bb2 804e78e]

86e2bb2 is the planner as it landed (its README figures: build validates, lower validates
again); 804e78e is main before the speed-up (lower hands out the program build checked).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [("interleaved", 32, 256, 2), ("1f1b", 64, 512, None), ("zbv", 16, 128, None)]

MEASURE = """
import hashlib, json, sys, time
import schedules
out = {}
for name, p, m, v in json.loads(sys.argv[1]):
    start = time.perf_counter()
    program = schedules.lower(schedules.build(name, ranks=p, microbatches=m, chunks=v))
    seconds = time.perf_counter() - start
    text = "\\n".join(" ".join(str(a) for a in s) for s in program.streams)
    out[f"{name} p={p} m={m}" + (f" v={v}" if v else "")] = [seconds, hashlib.sha256(text.encode()).hexdigest()]
print(json.dumps(out))
"""


def checkout(commit: str, into: Path) -> Path:
    """The schedules package of `commit`, extracted under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "schedules"], check=True, capture_output=True).stdout
    target = into / commit
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def measure(path: Path) -> dict[str, list]:
    # cwd=path: `python -c` puts the working directory first on sys.path.
    run = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(SHAPES)], check=True, capture_output=True, text=True, cwd=path,
                         env={**os.environ, "PYTHONPATH": str(path)})
    return json.loads(run.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--old", nargs="+", default=["86e2bb2", "804e78e"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        versions = {commit: checkout(commit, Path(tmp)) for commit in args.old}
        versions["this tree"] = ROOT
        times: dict[str, dict[str, list[float]]] = {v: {} for v in versions}
        hashes: dict[str, set[str]] = {}
        for _ in range(args.repeat):
            for version, path in versions.items():
                for shape, (seconds, digest) in measure(path).items():
                    times[version].setdefault(shape, []).append(seconds)
                    hashes.setdefault(shape, set()).add(digest)
    print(f"schedules.lower(schedules.build(...)), one call per fresh process, {args.repeat} repeats, versions alternating")
    print(f"{'shape':<28}{'version':<12}{'median s':>10}{'range s':>16}{'this tree is':>16}")
    for shape in times["this tree"]:
        new = statistics.median(times["this tree"][shape])
        for version in versions:
            t = times[version][shape]
            median = statistics.median(t)
            ratio = "" if version == "this tree" else f"{median / new:.1f}x faster"
            print(f"{shape:<28}{version:<12}{median:>10.3f}{f'{min(t):.3f}-{max(t):.3f}':>16}{ratio:>16}")
    different = [shape for shape, seen in hashes.items() if len(seen) != 1]
    print("programs: " + ("identical in every version" if not different else f"DIFFERENT for {different}"))
    return 1 if different else 0


if __name__ == "__main__":
    raise SystemExit(main())
