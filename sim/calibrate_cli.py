"""`python -m sim calibrate RUN_DIR -o costs.json`: fit the simulator's costs to a measured run."""

from __future__ import annotations

import argparse
import json
import sys

from schedules import ScheduleError

from .calibration import Calibration, calibrate
from .costs import CostError
from .measured import read_measured


def add_parser(subparsers) -> None:
    """Register `calibrate` on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "calibrate",
        help="fit compute, transfer and overhead costs to a measured run (python -m runtime --out DIR)",
        description=(
            "Read a run directory written by python -m runtime and fit the cost model: per-stage F/B (I/W) "
            "costs as fixed per-action + per-layer terms (the shape from the run's profile.json of "
            "--profile-layers, the level from the run's steps), the executor's dispatch, send, receive and "
            "per-step overheads, point-to-point latency (in-run transfers) and bandwidth (ping-pong of "
            "--profile-p2p), and activation bytes per stage. The result predicts other schedules and "
            "microbatch counts of the same model at the same microbatch size: pass it as --costs to "
            "python -m sim compare --measured. Every parameter is documented in sim/calibration.py."
        ),
    )
    parser.add_argument("run", metavar="RUN_DIR", help="run directory (timeline.csv, program.json, summary.json, ...)")
    parser.add_argument("-o", "--output", default="costs.json", metavar="FILE.json",
                        help="calibration file to write (default costs.json)")
    parser.add_argument("--json", action="store_true", help="print the calibration as JSON instead of a summary")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Handle `sim calibrate`; returns the exit code."""
    try:
        calibration = calibrate(read_measured(args.run))
        calibration.to_json(args.output)
    except (ScheduleError, CostError) as exc:
        print(f"sim calibrate: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sim calibrate: error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(calibration.to_dict(), indent=2))
    else:
        print(describe(calibration))
        print(f"wrote {args.output}")
    return 0


def describe(c: Calibration) -> str:
    """A few lines naming every fitted parameter."""
    def us(x: float) -> str:
        return f"{x * 1e6:.1f} us"

    src = c.source
    lines = [f"calibrated from {src['run']}: {src['schedule']} p={src['ranks']} m={src['microbatches']} "
             f"v={src['chunks']}, {src['steps']} steps, model {dict(c.model)}, {c.rows} rows per microbatch"]
    if c.compute is None:
        lines.append("no profile.json with layers: per-stage costs of this run only (same stages only)")
        for st in c.stages:
            times = "  ".join(f"{k} {st[k] * 1e3:.3f} ms" for k in ("F", "B", "I", "W") if k in st)
            lines.append(f"  stage {st['stage']} ({st['role']}, layers {st['layers'][0]}..{st['layers'][1] - 1}): {times}")
    else:
        for kind, fit in c.compute.items():
            fixed = ", ".join(f"{role} {fit.fixed[role] * 1e3:+.3f}" for role in fit.fixed)
            lines.append(f"  {kind}: {fit.per_layer * 1e3:.3f} ms per layer; fixed per action (ms): {fixed}; "
                         f"run/profile speed ratio {c.speed_ratio[kind]:.3f}")
    lines.append(f"  switch (action not repeating its rank's previous one): F +{us(c.switch_forward)}, "
                 f"B/I/W +{us(c.switch_backward)}")
    lines.append(f"  overheads: dispatch {us(c.dispatch_overhead)} per compute action, send {us(c.send_overhead)}, "
                 f"recv {us(c.recv_overhead)}, step {us(c.step_overhead)}")
    bandwidth = "unlimited" if c.p2p_bandwidth == float("inf") else f"{c.p2p_bandwidth / 1e9:.2f} GB/s"
    lines.append(f"  p2p: latency {us(c.p2p_latency)}, bandwidth {bandwidth}, {c.boundary_bytes:,} bytes per boundary")
    return "\n".join(lines)
