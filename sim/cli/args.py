"""What the subcommands share: argument types, the cost flags, and the one-line error.

The only module of sim/cli/ that the others import.
"""

from __future__ import annotations

import argparse
import math
import sys

from ..sources import CostOverrides


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


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def add_memory_limit_argument(parser: argparse.ArgumentParser) -> None:
    """Register --memory-limit, zb-auto's activation-memory cap."""
    parser.add_argument(
        "--memory-limit", type=positive_float, metavar="K",
        help="zb-auto's activation-memory limit per rank, in microbatches of one rank's share (p is 1F1B's "
        "memory, 2p ZB-2p's; default p); zb-auto's order is searched with simulations under the costs given",
    )


def memory_limit_unused(limit: float | None, chosen) -> str | None:
    """The refusal when --memory-limit is given but zb-auto is not among the schedules run."""
    if limit is not None and "zb-auto" not in chosen:
        return "--memory-limit applies to zb-auto only: add zb-auto to --schedules"
    return None


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    """Register --costs and the cost flags; each flag given overrides the same value of --costs."""
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
        help="input-gradient backward time I (default 1); a full backward B costs backward + weight "
        "(either flag replaces a file's backward_full)",
    )
    group.add_argument("--weight", type=finite_float, metavar="S", help="weight-gradient time W (default 1)")
    group.add_argument("--comm-latency", type=finite_float, metavar="S", help="seconds per point-to-point transfer (default 0)")
    group.add_argument(
        "--comm-bandwidth", type=float, metavar="BYTES_PER_S", help="bytes per second of a link (default unlimited); needs --comm-bytes",
    )
    group.add_argument("--comm-bytes", type=finite_float, metavar="BYTES", help="bytes crossing each stage boundary (default 0)")
    group.add_argument(
        "--no-contention", action="store_true", help="let transfers on one link overlap (default: one at a time)",
    )
    group.add_argument(
        "--activation-bytes", type=finite_float, metavar="BYTES",
        help="bytes of one microbatch's activations through one rank's share (M_B; default: a 1 GiB placeholder, "
        "so only microbatch counts mean anything); given, memory is reported in bytes",
    )
    group.add_argument(
        "--weight-memory-fraction", type=finite_float, metavar="X",
        help="share of those activations W still needs from I until W runs (M_W / M_B, 0..1; default 0; "
        "a transformer layer keeps about 32/34, Qi et al. 2024)",
    )


def cost_overrides(args: argparse.Namespace) -> CostOverrides:
    """The cost flags of parsed arguments (registered by add_cost_arguments), typed."""
    return CostOverrides(
        forward=args.forward, backward=args.backward, weight=args.weight, comm_latency=args.comm_latency,
        comm_bandwidth=args.comm_bandwidth, comm_bytes=args.comm_bytes, no_contention=args.no_contention,
        activation_bytes=args.activation_bytes, weight_memory_fraction=args.weight_memory_fraction,
    )


def fail(command: str, message: str) -> int:
    """Print `sim COMMAND: error: MESSAGE` on stderr (one line) and return exit code 2."""
    print(f"sim {command}: error: {message}", file=sys.stderr)
    return 2


def one_line(exc: Exception) -> str:
    """The first line of an exception's message (its type's name if it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
