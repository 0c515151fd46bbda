"""Command-line options that describe a cost model, shared by `sim compare` and `sim sweep`."""

from __future__ import annotations

import argparse
import dataclasses
import math

from .calibration import Calibration, load_costs
from .costs import CostError, CostModel

# The flags that change a cost model (a calibration is never changed by them).
COST_FLAGS = ("forward", "backward", "weight", "comm_latency", "comm_bandwidth", "comm_bytes")
# Used when neither a flag nor --costs gives a value: F = 1 s, I = 2 s, W = 0 (B = 3 s).
DEFAULT_COSTS = CostModel(forward=1.0, backward_input=2.0, backward_weight=0.0)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_ints(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 1 ('4,8,16')."""
    return [positive_int(part.strip()) for part in text.split(",") if part.strip()] or _empty(text)


def names(text: str) -> list[str]:
    """argparse type: comma-separated schedule names."""
    return [part.strip() for part in text.split(",") if part.strip()] or _empty(text)


def _empty(text: str):
    raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")


def finite_float(text: str) -> float:
    """argparse type: a finite number (range checks are the cost model's)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the cost flags; each one given overrides the same value of --costs."""
    group = parser.add_argument_group(
        "costs", "seconds per microbatch through one rank's share of the model (split evenly over its chunks); "
        "flags override --costs",
    )
    group.add_argument(
        "--costs", metavar="FILE.json",
        help="cost model file (sim.CostModel.to_json), or a calibration from python -m sim calibrate "
        "(resolved per schedule: its stages differ; not combined with the flags below)",
    )
    group.add_argument("--forward", type=finite_float, metavar="S", help="forward time F (default 1)")
    group.add_argument(
        "--backward", type=finite_float, metavar="S",
        help="input-gradient backward time I (default 2); a full backward B costs backward + weight "
        "(either flag replaces a file's backward_full)",
    )
    group.add_argument("--weight", type=finite_float, metavar="S", help="weight-gradient time W (default 0)")
    group.add_argument("--comm-latency", type=finite_float, metavar="S", help="seconds per point-to-point transfer (default 0)")
    group.add_argument(
        "--comm-bandwidth", type=float, metavar="BYTES_PER_S", help="bytes per second of a link (default unlimited); needs --comm-bytes",
    )
    group.add_argument("--comm-bytes", type=finite_float, metavar="BYTES", help="bytes crossing each stage boundary (default 0)")
    group.add_argument(
        "--no-contention", action="store_true", help="let transfers on one link overlap (default: one at a time)",
    )


def costs_from_args(args: argparse.Namespace) -> CostModel:
    """The cost model the flags describe: --costs (or the defaults), then each given flag.

    Raises CostError for a bad file or value.
    """
    base = CostModel.from_json(args.costs) if args.costs else DEFAULT_COSTS
    changes: dict = {}
    if args.forward is not None:
        changes["forward"] = args.forward
    if args.backward is not None or args.weight is not None:
        # B = backward + weight; the one not given keeps the file's value (or the default).
        changes["backward_full"] = None
        for flag, field in (("backward", "backward_input"), ("weight", "backward_weight")):
            value = getattr(args, flag)
            if value is None:
                value = getattr(base, field)
            changes[field] = value if value is not None else getattr(DEFAULT_COSTS, field)
    for flag, field in (
        ("comm_latency", "p2p_latency"), ("comm_bandwidth", "p2p_bandwidth"), ("comm_bytes", "p2p_activation_bytes"),
    ):
        if getattr(args, flag) is not None:
            changes[field] = getattr(args, flag)
    if args.comm_bytes is not None:
        changes["p2p_gradient_bytes"] = None
    if args.no_contention:
        changes["link_contention"] = False
    return dataclasses.replace(base, **changes) if changes else base


def given_cost_flags(args: argparse.Namespace) -> list[str]:
    """The cost flags given on the command line, as typed (e.g. ['--forward', '--no-contention'])."""
    flags = [f"--{name.replace('_', '-')}" for name in COST_FLAGS if getattr(args, name) is not None]
    return flags + (["--no-contention"] if args.no_contention else [])


def costs_or_calibration(args: argparse.Namespace) -> CostModel | Calibration:
    """The flags' cost model, or the calibration that --costs names (which gives each
    schedule the cost model of its own stages; flags cannot change it: CostError)."""
    loaded = load_costs(args.costs) if args.costs else None
    if not isinstance(loaded, Calibration):
        return costs_from_args(args)
    flags = given_cost_flags(args)
    if flags:
        raise CostError(f"{args.costs} is a calibration: its costs are not overridden by {', '.join(flags)}")
    return loaded
