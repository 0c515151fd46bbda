"""`python -m sim plan`: which data x tensor x pipeline configuration trains a model fastest on a cluster.

Parses the flags into a `sim.planner.PlanRequest`, calls `sim.planner.plan` and prints
(sim.planner.report). Bad or infeasible input: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys

# The planner's modules by name, not through its package: this module then stands right
# above what it calls (the package gathers them all).
from ..planner.calibrated import calibrated_request, load_calibration
from ..planner.cluster import GPUS, load_overrides, make_cluster
from ..planner.config import Space
from ..planner.errors import PlanError
from ..planner.models import load_model
from ..planner.report import explain, format_table, records, summary_line, table, torchrun_command
from ..planner.search import PlanRequest, plan


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return values


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _gigabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of GB, got {text!r}")
    return value


def _setting(text: str) -> tuple[str, float]:
    key, _, value = text.partition("=")
    try:
        return key.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=NUMBER, got {text!r}") from None


def add_parser(subparsers) -> None:
    """Register `plan` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "plan",
        help="choose data, tensor and pipeline parallelism (ZeRO, recomputation, schedule, microbatches) by simulation",
        description=(
            "Enumerate every legal configuration of a model on a cluster (t x p x d = GPUs, t inside a node unless "
            "--cross-node-tp), discard those that do not fit in memory, simulate the rest with the pipeline engine "
            "(bounded: the top K is exact without simulating everything) and print them ranked by step time. Any "
            "axis can be fixed. The model: a preset name or a HuggingFace config.json; cost model: sim/planner/."
        ),
    )
    p.add_argument("--model", help="preset name (e.g. gpt3-175b, llama3-70b) or a config.json file")
    p.add_argument("--gpus", type=_positive, required=True, help="GPUs in all (CPU ranks with --costs)")
    p.add_argument("--gpus-per-node", type=_positive, default=8, help="GPUs per node (default 8)")
    p.add_argument("--gpu", default="a100-80g", help=f"GPU preset: {', '.join(GPUS)} (default a100-80g)")
    p.add_argument("--global-batch", type=_positive, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=_positive, help="tokens per sequence (default: the model's)")
    p.add_argument("--memory-cap", type=_gigabytes, metavar="GB", help="memory per GPU a plan may use (default 90%% of the GPU's)")
    p.add_argument("--cluster", metavar="FILE.json", help="cluster overrides (keys: see sim/planner/cluster.py)")
    p.add_argument("--set", type=_setting, action="append", default=[], metavar="KEY=VALUE",
                   help="one cluster override, e.g. inter_gbps=50 or gemm_efficiency=0.6 (repeatable)")
    axes = p.add_argument_group("axes to fix (comma-separated values allowed)")
    axes.add_argument("--tp", type=_ints, help="tensor-parallel sizes")
    axes.add_argument("--pp", type=_ints, help="pipeline-parallel sizes")
    axes.add_argument("--dp", type=_ints, help="data-parallel sizes")
    axes.add_argument("--microbatch-size", type=_ints, help="sequences per microbatch (default 1,2,4,8)")
    axes.add_argument("--schedules", type=_names, help="pipeline schedules (default: all registered)")
    axes.add_argument("--chunks", type=_ints, help="stages per rank for schedules that take it (default 2,3,4,6,8)")
    axes.add_argument("--zero", type=_ints, help="ZeRO stages 0-3")
    axes.add_argument("--recompute", type=_names, help="activation recomputation: none, selective, full")
    axes.add_argument("--sequence-parallel", choices=("on", "off"), help="fix sequence parallelism")
    axes.add_argument("--cross-node-tp", action="store_true", help="allow tensor parallelism across nodes")
    out = p.add_argument_group("output")
    out.add_argument("--top", type=_positive, default=10, help="configurations to rank (default 10)")
    fmt = out.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print a JSON list of the ranked configurations, best first")
    fmt.add_argument("--csv", action="store_true", help="print the table as CSV")
    out.add_argument("--explain", action="store_true", help="explain the winner and the runner-up on each axis")
    out.add_argument("--emit", choices=("torchrun",), help="print the command that runs the winner")
    out.add_argument("--figure", metavar="FILE.png", help="plot step time against memory of every simulated configuration (all that fit with --exhaustive)")
    out.add_argument("--exhaustive", action="store_true", help="simulate every configuration that fits (no bound pruning)")
    out.add_argument("--costs", metavar="CALIBRATION.json",
                     help="take costs from a calibration of an executor run (its gpt model, t = d = 1, p = --gpus)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handle=handle)


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    """The typed request the flags describe; PlanError for bad or inconsistent values."""
    sp = None if args.sequence_parallel is None else ((args.sequence_parallel == "on"),)
    space = Space(tp=args.tp, pp=args.pp, dp=args.dp, schedules=args.schedules, chunks=args.chunks,
                  microbatch_sizes=args.microbatch_size, zero=args.zero, recompute=args.recompute,
                  sequence_parallel=sp, cross_node_tp=args.cross_node_tp)
    space.check()
    cap = None if args.memory_cap is None else args.memory_cap * 1e9
    if args.costs:
        calibration = load_calibration(args.costs)
        return calibrated_request(calibration, args.gpus, args.global_batch, space, args.top, cap)
    if not args.model:
        raise PlanError("give --model NAME|config.json (or --costs CALIBRATION.json for the executor's gpt model)")
    model = load_model(args.model)
    if args.seq_len:
        model = model.with_seq_len(args.seq_len)
    overrides = load_overrides(args.cluster) if args.cluster else {}
    overrides.update(dict(args.set))
    cluster = make_cluster(args.gpu, args.gpus, args.gpus_per_node, overrides)
    return PlanRequest(model, cluster, args.global_batch, space, top=args.top, memory_cap=cap,
                       exhaustive=args.exhaustive)


def handle(args: argparse.Namespace) -> int:
    """Handle `sim plan`; returns the exit code."""
    from tqdm import tqdm

    def progress(items, total):
        return tqdm(items, total=total, desc="plan", unit="config", file=sys.stderr, leave=False,
                    disable=args.no_progress or total < 200)

    try:
        request = request_from_args(args)
        result = plan(request, progress=progress, explain=args.explain)
    except PlanError as exc:
        print(f"sim plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(records(result), indent=2))
    elif args.csv:
        print(table(result).to_csv(index=False), end="")
    else:
        print(format_table(result))
        print(summary_line(result), file=sys.stderr)
    if args.explain:
        print()
        print(explain(result))
    if args.emit == "torchrun":
        print()
        print(torchrun_command(result))
    if args.figure:
        from ..plot.plan import plot_plan

        try:
            plot_plan(result, args.figure)
        except OSError as exc:
            print(f"sim plan: error: cannot write {args.figure}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0
