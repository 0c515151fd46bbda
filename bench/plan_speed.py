"""Speed of `python -m sim plan` on the issue's case, and the check that its answer is exact.

Plans GPT-3 175B on 1024 A100s (8 per node), global batch 1536, with --explain (the ranked top
10 plus the best configuration differing from the winner on each axis), `--repeat` times,
each with fresh caches, and prints the wall time of each (target: under 60 s) with the
search's counts. Then it re-simulates each of the top 10 from scratch (schedules.build +
lower + sim.simulate with the configuration's CostModel) and checks the step times are
identical. Last, the part of the time the issue names: building (generate + check) and
lowering one p=32, m=256, v=2 interleaved program (bench/plan_build_speed.py sets it against
the older code side by side).

    python bench/plan_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import schedules  # noqa: E402
import sim  # noqa: E402
from sim.planner import PlanRequest, load_model, make_cluster, plan  # noqa: E402
from sim.planner.report import summary_line  # noqa: E402


def direct_step_ns(ev) -> int:
    """The configuration's step time simulated from scratch."""
    c = ev.config
    built = schedules.build(c.schedule, ranks=c.pp, microbatches=c.microbatches,
                            chunks=None if schedules.generator(c.schedule).chunks else c.chunks)
    result = sim.simulate(schedules.lower(built), ev.costs.cost_model())
    last = [end for _, end in result.span_ns]
    return max([result.makespan_ns] + [a + b for a, b in zip(last, ev.costs.after_ns)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    request = PlanRequest(load_model("gpt3-175b"), make_cluster("a100-80g", 1024, 8), 1536, top=10)
    times, result = [], None
    for i in range(args.repeat):
        start = time.perf_counter()
        result = plan(request, explain=True)
        times.append(time.perf_counter() - start)
        print(f"run {i + 1}: {times[-1]:.1f} s  ({summary_line(result)})")
    print(f"plan gpt3-175b on 1024 A100, batch 1536, --explain: min {min(times):.1f} s, median "
          f"{statistics.median(times):.1f} s, max {max(times):.1f} s (target < 60 s)")
    start = time.perf_counter()
    mismatches = [ev.config.describe() for ev in result.ranked if direct_step_ns(ev) != ev.step_ns]
    print(f"top {len(result.ranked)} re-simulated from scratch in {time.perf_counter() - start:.1f} s: "
          + ("identical step times" if not mismatches else f"MISMATCH in {mismatches}"))
    builds, lowers = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        built = schedules.build("interleaved", ranks=32, microbatches=256, chunks=2)
        builds.append(time.perf_counter() - start)
        start = time.perf_counter()
        schedules.lower(built)
        lowers.append(time.perf_counter() - start)
    print(f"schedules.build (generate + check) interleaved p=32 m=256 v=2: median {statistics.median(builds):.3f} s; "
          f"schedules.lower (hands out the checked program): median {statistics.median(lowers):.3f} s")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
