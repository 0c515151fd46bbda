"""Tensor parallelism inside one gpt stage: F and B at tp=2 against tp=1, and the tp collectives' share.

    python bench/tp_collectives.py --layers 4 --hidden 256 --heads 8 --seq-len 64 --rows 8 --steps 30

Spawns 2 processes (gloo on CPU, one thread each). Each holds the same stage (`--layers`
transformer blocks of runtime.models, no embedding or head) twice: whole (tp=1) and split
across both processes by runtime/tensor_parallel.py (tp=2). Alternating one of each per
iteration, so both see the same machine load, it times the forward (F) of a microbatch of
`--rows` samples and then its backward (B), each from a barrier to the end of the call,
and prints the medians with their interquartile range. tp=1 here is each process running
the whole stage on its own core (what a rank of a pipeline without tp does); tp=2 puts the
two cores on one stage. Then, under torch.profiler, it measures how much of tp=2's F and B
is spent in the tp collectives: the CPU time of the all-reduces (`_c10d_functional::
all_reduce` issuing them, `_c10d_functional::wait_tensor` waiting for them, which includes
waiting for the slower rank) over the wall time of the call, median over profiled calls.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
from statistics import median, quantiles

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

COLLECTIVE_EVENTS = ("_c10d_functional::all_reduce", "_c10d_functional::wait_tensor")


def _timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _collective_share(fn) -> float:
    """Share of `fn`'s wall time spent issuing and waiting for collectives (profiled)."""
    from torch.profiler import ProfilerActivity, profile

    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    spent = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in COLLECTIVE_EVENTS) / 1e6
    return spent / wall


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from torch.distributed.device_mesh import init_device_mesh

    from runtime.models import ModelSpec, build
    from runtime.tensor_parallel import apply_tensor_parallel

    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    spec = ModelSpec(model="gpt", layers=args.layers, hidden=args.hidden, heads=args.heads, seq_len=args.seq_len,
                     vocab=32, batch_size=args.rows)
    whole = build(spec).stage_module(range(args.layers), False, False)
    modules = {1: whole, 2: apply_tensor_parallel(whole, mesh["tp"])}
    x = torch.randn(args.rows, args.seq_len, args.hidden, generator=torch.Generator().manual_seed(0))
    grad = torch.randn_like(x)
    times = {(t, k): [] for t in modules for k in "FB"}
    shares = {"F": [], "B": []}
    for i in range(args.warmup + args.steps + args.profiled):
        for t in (1, 2) if i % 2 == 0 else (2, 1):
            module = modules[t]
            inp = x.detach().requires_grad_(True)
            box = {}
            measure = i >= args.warmup and i < args.warmup + args.steps
            profiled = i >= args.warmup + args.steps and t == 2

            def forward():
                box["y"] = module(inp)

            def backward():
                box["y"].backward(grad)

            for kind, fn in (("F", forward), ("B", backward)):
                if profiled:
                    shares[kind].append(_collective_share(fn))
                else:
                    seconds = _timed(fn)
                    if measure:
                        times[(t, kind)].append(seconds)
            for p in module.parameters():
                p.grad = None
    if rank == 0:
        with open(out, "w") as f:
            f.write(_report(args, times, shares))
    dist.destroy_process_group()


def _stats(values: list[float]) -> str:
    q1, _, q3 = quantiles(values, n=4)
    return f"{median(values) * 1e3:8.2f} ms (IQR {q1 * 1e3:.2f}-{q3 * 1e3:.2f})"


def _report(args, times, shares) -> str:
    lines = [
        f"gpt stage: {args.layers} blocks, hidden {args.hidden}, {args.heads} heads, seq {args.seq_len}, "
        f"{args.rows} rows per microbatch; gloo, 1 thread per process; {args.steps} alternated iterations",
    ]
    for kind in "FB":
        one, two = median(times[(1, kind)]), median(times[(2, kind)])
        lines.append(f"{kind}: tp=1 {_stats(times[(1, kind)])}   tp=2 {_stats(times[(2, kind)])}   "
                     f"tp=2 / tp=1 {two / one:.3f}")
    for kind in "FB":
        q1, _, q3 = quantiles(shares[kind], n=4)
        lines.append(f"{kind} at tp=2: collectives {median(shares[kind]):.1%} of the wall time "
                     f"(IQR {q1:.1%}-{q3:.1%}, {len(shares[kind])} profiled calls)")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--rows", type=int, default=8, help="samples per microbatch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profiled", type=int, default=10, help="profiled tp=2 iterations after the timed ones")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = f"/tmp/tp_collectives.{os.getpid()}.txt"
    mp.spawn(_worker, args=(port, args, out), nprocs=2)
    with open(out) as f:
        print(f.read(), end="")
    os.remove(out)


if __name__ == "__main__":
    main()
