"""`python -m runtime`: run a schedule on torch.distributed, one process per rank.

    torchrun --nproc-per-node 2 -m runtime --schedule 1f1b --microbatches 8 \\
        --model mlp --layers 8 --hidden 512 --batch-size 64 --steps 10 --warmup 2 --out runs/NAME

The world size is pp x dp x tp (runtime/layout.py): --dp data-parallel replicas of a
--tp-way tensor-parallel pipeline of --pp ranks (default world / (dp x tp)), the
schedule's (or --program file's) ranks. Without torchrun it runs as a single rank. Exit codes: 0 done,
1 a peer failed or --check found a mismatch, 2 a bad configuration.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist

import schedules

from .allocator import FreedMemory
from .errors import ConfigError, PeerError
from .executor import POST_AHEAD_NAMES, RunOptions, default_device, execute, prepare
from .layout import Layout
from .models import MODELS, ModelSpec, build
from .profile import clear_profile, collect, write_profile
from .record import clear_summary, format_summary, write_outputs


class DefaultsHelp(argparse.HelpFormatter):
    """Help that states each option's default (argparse's ArgumentDefaultsHelpFormatter skips
    options without help text and prints "(default: None)" for the rest)."""

    def _format_action(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS
        if action.option_strings and not unset and "default" not in text:
            action = copy.copy(action)
            action.help = f"{text} (default: %(default)s)".strip()
        return super()._format_action(action)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m runtime", formatter_class=DefaultsHelp,
        description="Run a pipeline schedule's lowered instruction streams on torch.distributed (launch with torchrun).",
    )
    what = p.add_argument_group("schedule (one of --schedule or --program)")
    what.add_argument("--schedule", help=f"schedule name: {', '.join(schedules.available())}")
    what.add_argument("--microbatches", type=int, help="microbatches per step (with --schedule)")
    what.add_argument("--chunks", type=int, help="stages per rank, for schedules that take it (interleaved)")
    what.add_argument("--program", type=Path, help="a lowered program or schedule file (.json or .csv)")
    layout = p.add_argument_group("layout (pp x dp x tp = world size; see runtime/layout.py)")
    layout.add_argument("--pp", type=int, help="pipeline ranks, the schedule's ranks (default: world size / (dp x tp))")
    layout.add_argument("--dp", type=int, default=1, help="data-parallel replicas of the pipeline")
    layout.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks inside each stage")
    model = p.add_argument_group("model")
    model.add_argument("--model", default="mlp", choices=MODELS)
    model.add_argument("--layers", type=int, default=8, help="layers (mlp blocks or transformer blocks)")
    model.add_argument("--hidden", type=int, default=512)
    model.add_argument("--batch-size", type=int, default=64, help="samples per step, cut into the microbatches")
    model.add_argument("--heads", type=int, default=8, help="gpt: attention heads")
    model.add_argument("--seq-len", type=int, default=64, help="gpt: tokens per sample")
    model.add_argument("--vocab", type=int, default=512, help="gpt: vocabulary size")
    model.add_argument("--seed", type=int, default=0, help="seed of the parameters and the synthetic batch")
    model.add_argument("--split", help="layers per stage, comma-separated (default: balanced by count)")
    run = p.add_argument_group("run")
    run.add_argument("--steps", type=int, default=10, help="measured steps")
    run.add_argument("--warmup", type=int, default=2, help="unmeasured steps before them")
    run.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a peer before failing")
    run.add_argument("--check", action="store_true", help="compare loss and gradients with a one-process run")
    run.add_argument("--post-ahead", type=post_ahead, default="auto", metavar="K|step|auto",
                     help="post each receive K compute actions before its RECV (0: at the RECV), or every "
                     "receive of a step at its start ('step'); default auto: 'step' on gloo, 1 on NCCL")
    run.add_argument("--profile-layers", action="store_true",
                     help="after the steps, time F/B of each stage role at 1, 2 and 4 layers (profile.json, for sim calibrate)")
    run.add_argument("--profile-p2p", action="store_true",
                     help="after the steps, ping-pong ranks 0 and 1 at several sizes (profile.json, for sim calibrate)")
    run.add_argument("--freed-memory", type=freed_memory, default=FreedMemory.KEEP, metavar="keep|release",
                     help="CPU: keep freed activations' memory for the next step, as a GPU's caching allocator does, "
                     "or release it to the operating system (glibc's default, which makes a step slower the more "
                     "activations it holds; runtime/allocator.py)")
    run.add_argument("--out", type=Path, help="output directory (default runs/SCHEDULE-pP-mM)")
    return p


def load_program(args: argparse.Namespace, pipeline_ranks: int, data_parallel: int = 1) -> schedules.Program:
    """The program to run, from --program or --schedule (with gradient reductions when
    `data_parallel` > 1; a program file without them gets them in `prepare`); raises ConfigError."""
    try:
        if args.program is not None:
            if args.schedule is not None:
                raise ConfigError("give either --schedule or --program, not both")
            if args.program.suffix.lower() == ".csv":
                return schedules.load_program_csv(args.program)
            return schedules.load_program_json(args.program)
        if args.schedule is None:
            raise ConfigError("give --schedule NAME --microbatches M, or --program FILE")
        if args.microbatches is None:
            raise ConfigError("--schedule needs --microbatches")
        schedule = schedules.build(args.schedule, ranks=pipeline_ranks, microbatches=args.microbatches, chunks=args.chunks)
        return schedules.lower(schedule, data_parallel)
    except schedules.ScheduleError as exc:
        raise ConfigError(str(exc)) from None


def freed_memory(text: str) -> FreedMemory:
    """argparse type of --freed-memory: 'keep' or 'release'."""
    try:
        return FreedMemory(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'keep' or 'release'; got {text!r}") from None


def post_ahead(text: str) -> int | str:
    """argparse type of --post-ahead: a count of compute actions, 'step' or 'auto'."""
    if text in POST_AHEAD_NAMES:
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more compute actions, 'step' or 'auto'; got {text!r}")
    return value


def parse_split(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--split must be comma-separated layer counts such as 3,3,2; got {text!r}") from None


def _environment() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's variables; a lone process is rank 0 of 1."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        raise ConfigError("RANK and WORLD_SIZE must be integers (launch with torchrun)") from None


# Seconds a rank told to stop keeps running to find and report the failure itself.
TERMINATION_GRACE = 5.0


def report_termination(rank: int, grace: float = TERMINATION_GRACE) -> None:
    """On SIGTERM, give this rank `grace` seconds to report the failure itself, then say it was stopped.

    torchrun stops the surviving ranks with SIGTERM as soon as one rank exits (it polls every
    0.1 s), usually before they have noticed the failure: without a handler they die silently
    and no line names the action they waited on. A rank whose peer died finds out within a
    moment (a closed connection) or at `--timeout`, prints its line and exits on its own; the
    grace timer only speaks for a rank that did not.
    """

    def stopped() -> None:
        print(f"error: rank {rank}: stopped by the launcher (SIGTERM) before finding a failure itself; "
              "another rank's line names the cause", file=sys.stderr, flush=True)
        os._exit(1)

    def on_sigterm(signum, frame) -> None:
        timer = threading.Timer(grace, stopped)
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_sigterm)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    report_termination(rank)
    try:
        rank, world, local_rank = _environment()
        layout = Layout.for_world(world, args.pp, args.dp, args.tp)
        program = load_program(args, layout.pp, layout.dp)
        spec = ModelSpec(
            model=args.model, layers=args.layers, hidden=args.hidden, batch_size=args.batch_size,
            heads=args.heads, seq_len=args.seq_len, vocab=args.vocab, seed=args.seed,
        )
        spec.check()
        options = RunOptions(
            steps=args.steps, warmup=args.warmup, timeout=args.timeout, check=args.check,
            split=parse_split(args.split), post_ahead=args.post_ahead, layout=layout, freed_memory=args.freed_memory,
        )
        model = build(spec)
        program = prepare(program, model, options, world).program  # every configuration error surfaces here, on every rank
    except ConfigError as exc:
        print(f"rank {rank}: error: {exc}", file=sys.stderr)
        return 2
    schedule = program.schedule
    axes = "".join(f"-{axis}{n}" for axis, n in (("d", layout.dp), ("t", layout.tp)) if n > 1)
    out = args.out or Path("runs") / f"{schedule.name}-p{schedule.ranks}-m{schedule.microbatches}{axes}"
    device = default_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        timeout=datetime.timedelta(seconds=args.timeout),
        device_id=device if device.type == "cuda" else None,
    )
    try:
        if rank == 0:
            clear_summary(out)
            clear_profile(out)
        def ready() -> None:
            if rank == 0:
                print(f"running {schedule.describe()}: {options.warmup} warm-up and {options.steps} measured steps", flush=True)

        result = execute(program, model, options, device, on_ready=ready)
        profile = None
        if args.profile_layers or args.profile_p2p:
            profile = collect(program, model, device, layers=args.profile_layers, p2p=args.profile_p2p, layout=layout)
    except ConfigError as exc:
        print(f"rank {rank}: error: {exc}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    except PeerError as exc:
        # The group cannot be torn down cleanly with a dead peer: leave at once.
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    if rank == 0:
        if profile:
            write_profile(out, profile)  # before summary.json, which marks a run directory complete
        write_outputs(result, program, out)
        print(format_summary(result.summary))
        print(f"wrote {out}/ (timeline.csv, memory.csv, program.json, summary.json{', profile.json' if profile else ''})")
    # Objects in reference cycles can keep the process group alive until interpreter exit,
    # where gloo's worker threads abort the process; free them while Python is whole.
    gc.collect()
    dist.destroy_process_group()
    return 1 if result.passed is False else 0
