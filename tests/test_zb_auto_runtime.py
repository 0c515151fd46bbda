"""zb-auto on the executor: a program saved as CSV runs unchanged through `torchrun -m
runtime --program`, passes --check, and its measured saved-tensor peak stays within the
memory limit K in units of one microbatch's footprint on that stage (the largest bytes
one microbatch holds between its F and its W, measured alone with the same microbatch
size). zb-auto's default costs count that whole footprint until W, so the bound holds
whatever W keeps on this executor (for an mlp, each Linear's input and output gradient:
more than the forward's activations)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

import schedules
from ranks import free_port

RANKS, ROWS = 2, 2  # rows per microbatch
MODEL = {"model": "mlp", "layers": 2, "hidden": 16}
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
REPO = Path(__file__).resolve().parents[1]


def _worker(rank: int, port: int, programs: list, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from runtime import ModelSpec, RunOptions, build_model, execute

    dist.init_process_group("gloo", rank=rank, world_size=RANKS, timeout=datetime.timedelta(seconds=60))
    peaks = []
    for program in programs:
        spec = ModelSpec(**MODEL, batch_size=ROWS * program.schedule.microbatches)
        result = execute(program, build_model(spec), RunOptions(steps=1, warmup=0, timeout=60))
        if rank == 0:
            peaks.append(result.summary["peak_activation_bytes"])
    if rank == 0:
        Path(out).write_text(json.dumps(peaks))
    dist.destroy_process_group()


def _measure(programs: list, tmp_path: Path) -> list[list[int]]:
    out = tmp_path / "peaks.json"
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, programs, str(out))) for r in range(RANKS)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
    assert [proc.exitcode for proc in procs] == [0] * RANKS
    return json.loads(out.read_text())


def test_measured_peak_within_the_limit_and_csv_runs_unchanged(tmp_path):
    limits = (1, 2, 3)
    m = 8
    files = []
    for limit in limits:
        path = tmp_path / f"zb-auto-K{limit}.csv"
        schedules.save_csv(schedules.lower(schedules.build("zb-auto", RANKS, m, memory_limit=limit)), path)
        files.append(path)
    alone = schedules.lower(schedules.build("zb-auto", RANKS, 1))
    everything = schedules.lower(schedules.build("gpipe", RANKS, m))
    programs = [alone, everything] + [schedules.load_program_csv(path) for path in files]
    footprint, gpipe, *peaks = _measure(programs, tmp_path)
    assert all(f > 0 for f in footprint)
    assert gpipe[0] > max(limits) * footprint[0]  # all m microbatches at once: the bound can bite
    for limit, peak in zip(limits, peaks):
        for rank in range(RANKS):
            assert peak[rank] <= limit * footprint[rank], (limit, rank, peak, footprint)
    assert peaks[0][0] < peaks[-1][0]  # a larger limit lets the first rank hold more

    run = tmp_path / "run"
    args = ["--program", str(files[1]), "--model", "mlp", "--layers", "2", "--hidden", "16",
            "--batch-size", str(ROWS * m), "--steps", "1", "--warmup", "0", "--check", "--timeout", "60",
            "--out", str(run)]
    cmd = [TORCHRUN, "--nproc-per-node", str(RANKS), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           "-m", "runtime", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["schedule"] == "zb-auto-K2" and summary["check"]["passed"] is True  # named after the file
    assert all(b <= 2 * f for b, f in zip(summary["peak_activation_bytes"], footprint))
