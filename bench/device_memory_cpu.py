"""sim.device_memory against allocations measured on the CPU (no GPU needed).

    python bench/device_memory_cpu.py [--hidden 256 --rows 64]

Two gloo ranks run each configuration (mlp, 2 layers per stage): a warm-up step, then one
step under torch.profiler with profile_memory=True, whose allocation and free events give
the most bytes the step allocated at once on each rank beyond what it started with (the
weights and the batch; the step's first action frees the previous step's gradients). That
is set against the prediction's step-time part: gradients + activations + receive buffers
+ sent tensors, with activation bytes calibrated from the run itself. The last column is
what the prediction leaves out by design (temporaries inside a backward), written as
multiples of the run's own sizes: one layer's parameters (a new weight gradient before it
is added to .grad) and boundary tensors (gradients flowing through the stage).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CONFIGS = [  # schedule, microbatches, chunks, post_ahead
    ("gpipe", 4, None, "step"),
    ("1f1b", 4, None, 0),
    ("1f1b", 8, None, 1),
    ("interleaved", 4, 2, "step"),
    ("zb-h1", 4, None, 1),
]


def _step_peak(session) -> int:
    """Most bytes allocated at once during one step beyond what was allocated at its start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        session.step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.nbytes()), key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def _worker(rank: int, port: int, config: tuple, hidden: int, rows: int, queue) -> None:
    """One configuration in fresh processes: the profiler's record of which blocks it saw
    allocated outlives a profiling session, so a second one in the same process can report
    frees of blocks allocated between the two."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import schedules
    from runtime import ModelSpec, RunOptions, Session, build_model
    from runtime.record import write_outputs

    name, m, chunks, post_ahead = config
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
    program = schedules.lower(schedules.build(name, ranks=2, microbatches=m, chunks=chunks))
    model = build_model(ModelSpec(model="mlp", layers=4 * program.schedule.chunks, hidden=hidden,
                                  batch_size=rows * m))
    with Session(program, model, RunOptions(post_ahead=post_ahead)) as session:
        session.step(measured=False)
        peak = _step_peak(session)
        result = session.finish()
    peaks = [None, None]
    dist.all_gather_object(peaks, peak)
    if rank == 0:
        out = tempfile.mkdtemp(prefix="device_memory_cpu.")
        write_outputs(result, program, out)
        queue.put((name, m, chunks, post_ahead, out, peaks))
    dist.destroy_process_group()


def measure(config: tuple, hidden: int, rows: int):
    """(name, m, chunks, post_ahead, run directory, per-rank step peaks) of one configuration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, config, hidden, rows, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    result = queue.get(timeout=300)
    for proc in procs:
        proc.join(timeout=60)
    if any(proc.exitcode != 0 for proc in procs):
        raise RuntimeError(f"{config}: ranks exited with {[proc.exitcode for proc in procs]}")
    return result


def predict(out: str):
    """Per rank, the prediction for a run directory, with activations calibrated from the run."""
    from sim.calibration import calibrate
    from sim.device_memory import ExecutorMemory, peak_device_memory
    from sim.measured import read_measured

    run = read_measured(out)
    summary = run.summary
    executor = ExecutorMemory(tuple(int(s["param_bytes"]) for s in summary["stage_costs"]),
                              int(summary["batch_bytes"]), 0.0, summary["post_ahead"])
    return peak_device_memory(run.program, calibrate(run).for_run(run), executor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rows", type=int, default=64, help="rows per microbatch")
    args = parser.parse_args(argv)
    results = [measure(config, args.hidden, args.rows) for config in CONFIGS]
    layer = (args.hidden * args.hidden + args.hidden) * 4
    boundary = args.rows * args.hidden * 4
    print(f"mlp hidden {args.hidden}, {args.rows} rows per microbatch, 2 layers per stage, p=2 (gloo): "
          f"one layer's parameters {layer:,} B, one boundary tensor {boundary:,} B")
    print(f"{'schedule':<12}{'m':>3}{'v':>3}{'post':>6}{'rank':>6}{'measured':>12}{'predicted':>12}{'error':>9}"
          f"  missing")
    for name, m, chunks, post_ahead, out, peaks in results:
        for d, measured in zip(predict(out), peaks):
            predicted = d.gradients + d.activations + d.receive_buffers + d.send_buffers
            missing = measured - predicted
            print(f"{name:<12}{m:>3}{chunks or 1:>3}{str(post_ahead):>6}{d.rank:>6}{measured:>12,}{predicted:>12,}"
                  f"{(predicted - measured) / measured * 100:>+8.1f}%  {missing:,} B = {missing / layer:.2f} layer"
                  f" or {(missing - layer) / boundary:+.2f} boundary after one layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
