"""Simulator speed: lowered actions per second at p=32, m=256, and a 100-configuration sweep.

Run: python bench/sim_speed.py [--repeat N]

Everything runs in one thread (one core). For each schedule it times `simulate(program,
costs)` on an already lowered program (metrics only: the timeline and memory DataFrames are
built lazily) and, separately, simulate plus building both DataFrames; best of --repeat runs.
The sweep runs what `sim.sweep.simulate_all` runs for each configuration (generate and check
with `schedules.build`, then lower and simulate) over gpipe, 1f1b and interleaved v=2,3,4 at p in
{4, 8, 16, 32} and m in {32, 64, 96, 128, 256}, timing the two halves apart.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import schedules  # noqa: E402
from sim import CostModel, simulate, sweep  # noqa: E402

COSTS = CostModel(forward=1.0, backward_input=2.0)


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def with_tables(program) -> None:
    result = simulate(program, COSTS)
    result.timeline, result.memory  # noqa: B018  (build both frames)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement; the best counts (default 5)")
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cores, one thread used")
    print(f"{'schedule':<16}{'actions':>9}{'simulate s':>12}{'actions/s':>12}{'+tables s':>11}{'actions/s':>12}")
    for name, chunks in (("1f1b", None), ("interleaved", 2), ("interleaved", 4)):
        program = schedules.lower(schedules.build(name, ranks=32, microbatches=256, chunks=chunks))
        n = program.num_actions
        bare = best_of(args.repeat, lambda: simulate(program, COSTS))
        full = best_of(args.repeat, lambda: with_tables(program))
        label = name if chunks is None else f"{name} v={chunks}"
        print(f"{label:<16}{n:>9}{bare:>12.3f}{n / bare:>12,.0f}{full:>11.3f}{n / full:>12,.0f}")

    configs = sweep.combinations(
        ["gpipe", "1f1b", "interleaved"], [4, 8, 16, 32], [32, 64, 96, 128, 256], [2, 3, 4]
    )
    # The body of sim.sweep.simulate_all, with the two halves timed apart.
    building = simulating = 0.0
    actions = 0
    for config in configs:
        began = time.perf_counter()
        schedule = sweep.build(config)
        built = time.perf_counter()
        actions += sweep.row(schedule, COSTS)["actions"]
        simulating += time.perf_counter() - built
        building += built - began
    print(
        f"sweep: {len(configs)} configurations, {actions:,} lowered actions, {building + simulating:.2f} s in all: "
        f"schedules.build (generate + validate) {building:.2f} s, lower + simulate {simulating:.2f} s "
        f"({actions / simulating:,.0f} actions/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
