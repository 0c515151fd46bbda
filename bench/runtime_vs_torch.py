"""Step time of our executor against torch.distributed.pipelining, same model, batch and m.

    python bench/runtime_vs_torch.py --ranks 2 --microbatches 8 --layers 8 --hidden 512 --batch-size 64

Spawns one process per rank (gloo on CPU, one thread each). For every schedule and
microbatch count it alternates rounds of the two executors in the same process group
(ours: `runtime.execute`; torch: ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B
on the same layers, partition and batch), times every step the same way, from a
barrier before the step to a barrier after it, and prints the median step times and
their ratio (ours / torch: below 1 means ours is faster). Ours runs as specified (each
receive posted at its RECV) and, as a second column, with receives posted one compute
action ahead (`--post-ahead 1`), which is how torch's lowering places them.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import socket
import sys
import time
from statistics import median

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}


def torch_steps(model, layers, schedule_name: str, ranks: int, m: int, chunks: int, steps: int) -> list[float]:
    """Run `steps` steps of torch's schedule; returns barrier-to-barrier seconds of each."""
    from torch.distributed import pipelining

    rank = dist.get_rank()
    num_stages = len(layers)
    local = [s for s in range(num_stages) if s % ranks == rank]  # looped placement, as ours
    stages = [
        pipelining.PipelineStage(
            copy.deepcopy(model.stage_module(layers[s], s == 0, s == num_stages - 1)), s, num_stages, torch.device("cpu")
        )
        for s in local
    ]
    cls = getattr(pipelining, TORCH_SCHEDULES[schedule_name])
    if schedule_name == "interleaved":
        sched = cls(stages, n_microbatches=m, loss_fn=model.loss)
    else:
        sched = cls(stages[0], n_microbatches=m, loss_fn=model.loss)
    holds_first, holds_last = 0 in local, num_stages - 1 in local
    times = []
    for _ in range(steps):
        for stage in stages:
            stage.submod.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter_ns()
        args = (model.inputs,) if holds_first else ()
        kwargs = {"target": model.targets} if holds_last else {}
        sched.step(*args, return_outputs=False, **kwargs)
        dist.barrier()
        times.append((time.perf_counter_ns() - t0) / 1e9)
    return times


def worker(rank: int, args: argparse.Namespace, port: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(args.ranks))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks, timeout=datetime.timedelta(seconds=120))
    import schedules
    from runtime import ModelSpec, RunOptions, build_model, execute, partition

    rows = []
    for name in args.schedules:
        for m in args.microbatches:
            chunks = args.chunks if name == "interleaved" else 1
            try:
                program = schedules.lower(schedules.build(name, ranks=args.ranks, microbatches=m, chunks=chunks if chunks > 1 else None))
            except schedules.ScheduleError as exc:
                if rank == 0:
                    print(f"skip {name} m={m}: {exc}", flush=True)
                continue
            spec = ModelSpec(model="mlp", layers=args.layers, hidden=args.hidden, batch_size=args.batch_size)
            model = build_model(spec)
            layers = partition(args.layers, program.schedule.num_stages)
            ours: dict[int, list[float]] = {0: [], 1: []}
            theirs: list[float] = []
            for _ in range(args.rounds):
                for ahead in ours:
                    result = execute(program, model, RunOptions(steps=args.steps, warmup=args.warmup, post_ahead=ahead))
                    if rank == 0:
                        ours[ahead] += result.summary["step_times"]
                t = torch_steps(model, layers, name, args.ranks, m, chunks, args.warmup + args.steps)
                theirs += t[args.warmup :]
            if rank == 0:
                row = (name, args.ranks, m, chunks, median(ours[0]), median(ours[1]), median(theirs))
                rows.append(row)
                print(f"{name:12s} p={args.ranks} m={m:<3d} v={chunks}  ours {row[4] * 1e3:8.2f} ms  "
                      f"ours ahead-1 {row[5] * 1e3:8.2f} ms  torch {row[6] * 1e3:8.2f} ms  "
                      f"ratios {row[4] / row[6]:.3f} {row[5] / row[6]:.3f}", flush=True)
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--microbatches", type=int, nargs="+", default=[8])
    p.add_argument("--schedules", nargs="+", default=list(TORCH_SCHEDULES), choices=list(TORCH_SCHEDULES))
    p.add_argument("--chunks", type=int, default=2, help="stages per rank for interleaved")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round and executor")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before each round's timed ones")
    p.add_argument("--rounds", type=int, default=5, help="alternations of ours and torch's")
    args = p.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, port, queue)) for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    rows = queue.get()
    for proc in procs:
        proc.join()
    if any(proc.exitcode for proc in procs):
        print("error: a rank failed", file=sys.stderr)
        return 1
    print()
    print(f"mlp --layers {args.layers} --hidden {args.hidden} --batch-size {args.batch_size}, gloo CPU, "
          f"1 thread per rank, median of {args.rounds} x {args.steps} steps, torch {torch.__version__}")
    print("| schedule | p | m | v | ours (ms) | ours, post-ahead 1 (ms) | torch (ms) | ours / torch | post-ahead 1 / torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, ranks, m, chunks, ours, ahead, theirs in rows:
        print(f"| {name} | {ranks} | {m} | {chunks} | {ours * 1e3:.2f} | {ahead * 1e3:.2f} | {theirs * 1e3:.2f} | "
              f"{ours / theirs:.3f} | {ahead / theirs:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
