"""zb-auto against the zero-bubble paper's published ZB-1p and ZB-2p bubble rates, and how
long planning takes.

    python bench/zb_auto_vs_paper.py [--max-evaluations 200] [--models 1.5B,6.2B,14.6B,28.3B]

For every setting of the paper's Table 5 (its profiled T_F, T_B, T_W, T_comm, Table 9; see
bench/zero_bubble_paper.py) and both limits (ZB-1p: K = p, ZB-2p: K = 2p microbatch
activations, with the paper's memory model: a forward holds M_B, I leaves M_W = 32h /
(34h + 5as) of it for W), it plans zb-auto twice: the heuristic alone (the paper's grid,
scored by its own time model) and the search scored by this simulator on the paper's cost
(the longest rank span). It prints the published rate, ours, the signed difference
(ours - published; negative is better), the simulated peak activation in microbatches of
one rank's share, and the wall time of each plan (single thread, one run each).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path


def load_paper():
    path = Path(__file__).resolve().parent / "zero_bubble_paper.py"
    spec = importlib.util.spec_from_file_location("zero_bubble_paper", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-evaluations", type=int, default=200, help="simulations the search may run")
    parser.add_argument("--models", default="1.5B,6.2B,14.6B,28.3B", help="comma-separated model sizes")
    args = parser.parse_args(argv)
    paper = load_paper()
    models = args.models.split(",")
    unknown = sorted(set(models) - set(paper.MODELS))
    if unknown or args.max_evaluations < 1:
        parser.error(f"unknown model(s) {', '.join(unknown)}" if unknown else "--max-evaluations must be >= 1")

    from schedules.zb_auto import plan
    from sim import simulate
    from sim.zb_search import Objective, auto_costs, auto_schedule

    print("| model | p | m | limit | published | zb-auto heuristic | difference | zb-auto search | difference "
          "| peak (units) | heuristic s | search s |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for setting in paper.SETTINGS:
        if setting.model not in models:
            continue
        costs = paper.cost_model(setting, setting.weight_memory_fraction)
        p, m = setting.ranks, setting.microbatches
        for limit, name in ((p, "zb-1p"), (2 * p, "zb-2p")):
            start = time.perf_counter()
            alone = plan(p, m, auto_costs(costs, p, weight_memory=None), limit).schedule
            heuristic_s = time.perf_counter() - start
            start = time.perf_counter()
            searched = auto_schedule(costs, p, m, limit, objective=Objective.SPAN, weight_memory=None,
                                     max_evaluations=args.max_evaluations)
            search_s = time.perf_counter() - start
            published = setting.rates[name]
            ours = [round(simulate(s, costs).bubble_ratio_rank_span, 4) for s in (alone, searched)]
            peak = max(simulate(searched, costs).peak_activation)
            print(f"| {setting.model} | {p} | {m} | {name} (K={limit}) | {published:.4f} | {ours[0]:.4f} | "
                  f"{ours[0] - published:+.4f} | {ours[1]:.4f} | {ours[1] - published:+.4f} | {peak:.2f} | "
                  f"{heuristic_s:.2f} | {search_s:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
