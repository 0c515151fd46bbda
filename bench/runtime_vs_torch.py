"""Step time of our executor against torch.distributed.pipelining, same model, batch and m.

    python bench/runtime_vs_torch.py --ranks 2 --microbatches 8 --layers 8 --hidden 512 --batch-size 64

Spawns one process per rank (gloo on CPU, one thread each). For every schedule and
microbatch count it builds, in the same process group, our executor twice (with its
default on gloo, every receive of a step posted at the step's start, `--post-ahead step`;
and with each receive posted one compute action ahead of its RECV, `--post-ahead 1`, the
earlier default) and torch's schedule
(ScheduleGPipe, Schedule1F1B or ScheduleInterleaved1F1B) on identical copies of the same
layers, partition and batch. It then alternates single steps of the three, rotating
their order, so all see the same machine load; every step is timed the same way, from a
barrier before it to a barrier after it. It prints the median step times and the ratios
ours / torch (below 1: ours is faster).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import os
import socket
import sys
import time
from statistics import median

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}


class TorchRun:
    """torch.distributed.pipelining's schedule on this rank's stages (looped placement, as ours)."""

    def __init__(self, model, layers, schedule_name: str, ranks: int, m: int):
        from torch.distributed import pipelining

        rank = dist.get_rank()
        num_stages = len(layers)
        local = [s for s in range(num_stages) if s % ranks == rank]
        self.stages = [
            pipelining.PipelineStage(
                copy.deepcopy(model.stage_module(layers[s], s == 0, s == num_stages - 1)), s, num_stages,
                torch.device("cpu"),
            )
            for s in local
        ]
        cls = getattr(pipelining, TORCH_SCHEDULES[schedule_name])
        stages = self.stages if schedule_name == "interleaved" else self.stages[0]
        self.schedule = cls(stages, n_microbatches=m, loss_fn=model.loss)
        self.args = (model.inputs,) if 0 in local else ()
        self.kwargs = {"target": model.targets} if num_stages - 1 in local else {}

    def step(self) -> float:
        """One step; seconds from a barrier before it to a barrier after it."""
        for stage in self.stages:
            stage.submod.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter_ns()
        self.schedule.step(*self.args, return_outputs=False, **self.kwargs)
        dist.barrier()
        return (time.perf_counter_ns() - t0) / 1e9


def worker(rank: int, args: argparse.Namespace, port: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(args.ranks))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks, timeout=datetime.timedelta(seconds=300))
    import schedules
    from runtime import ModelSpec, RunOptions, Session, build_model, partition

    rows = []
    for name in args.schedules:
        for m in args.microbatches:
            chunks = args.chunks if name == "interleaved" else None
            try:
                program = schedules.lower(schedules.build(name, ranks=args.ranks, microbatches=m, chunks=chunks))
            except schedules.ScheduleError as exc:
                if rank == 0:
                    print(f"skip {name} m={m}: {exc}", flush=True)
                continue
            spec = ModelSpec(model="mlp", layers=args.layers, hidden=args.hidden, batch_size=args.batch_size)
            layers = partition(args.layers, program.schedule.num_stages)
            runs = {
                "ours": Session(program, build_model(spec), RunOptions()),
                "ours, post-ahead 1": Session(program, build_model(spec), RunOptions(post_ahead=1)),
            }
            theirs = TorchRun(build_model(spec), layers, name, args.ranks, m)
            steppers = {
                "ours": runs["ours"].step,
                "ours, post-ahead 1": runs["ours, post-ahead 1"].step,
                "torch": theirs.step,
            }
            names = list(steppers)
            times: dict[str, list[float]] = {k: [] for k in names}
            for i in range(args.warmup + args.steps):
                order = names[i % 3 :] + names[: i % 3]  # rotate, so no executor always goes first
                for key in order:
                    if key == "torch":
                        wall = steppers[key]()
                    else:
                        wall = steppers[key](measured=i >= args.warmup)
                    if i >= args.warmup:
                        times[key].append(wall)
            for session in runs.values():
                session.finish()
            if rank == 0:
                med = {k: median(v) for k, v in times.items()}
                row = (name, args.ranks, m, chunks or 1, med["ours"], med["ours, post-ahead 1"], med["torch"])
                rows.append(row)
                print(f"{name:12s} p={args.ranks} m={m:<3d} v={chunks or 1}  ours {row[4] * 1e3:8.2f} ms  "
                      f"ours post-ahead 1 {row[5] * 1e3:8.2f} ms  torch {row[6] * 1e3:8.2f} ms  "
                      f"ratios {row[4] / row[6]:.3f} {row[5] / row[6]:.3f}", flush=True)
    if rank == 0:
        queue.put(rows)
    gc.collect()  # see runtime/cli.py: cycles must not keep the group alive until exit
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
    p.add_argument("--steps", type=int, default=40, help="timed steps of each executor")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps of each executor first")
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
    print(f"mlp --layers {args.layers} --hidden {args.hidden} --batch-size {args.batch_size}, gloo on CPU, "
          f"1 thread per rank, median of {args.steps} alternated steps each, torch {torch.__version__}")
    print("| schedule | p | m | v | ours (ms) | ours, post-ahead 1 (ms) | torch (ms) | ours / torch | post-ahead 1 / torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, ranks, m, chunks, ours, one_ahead, theirs in rows:
        print(f"| {name} | {ranks} | {m} | {chunks} | {ours * 1e3:.2f} | {one_ahead * 1e3:.2f} | {theirs * 1e3:.2f} | "
              f"{ours / theirs:.3f} | {one_ahead / theirs:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
