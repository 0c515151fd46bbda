"""What the multi-process tests share to start ranks on this machine (imported by test modules)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env() -> dict:
    """The environment of a launched rank: one thread per rank (two cores are shared by every
    process of the test run), unbuffered output so error lines arrive whole."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def workers(parent: int) -> dict[int, int]:
    """Global rank -> pid of the workers torchrun `parent` started (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != parent:
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
        except (OSError, ValueError, IndexError):
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(entry.name)
    return found


def wait_ready(proc) -> None:
    """Read rank 0's stdout until it says the steps are running."""
    line = proc.stdout.readline()
    while line and not line.startswith("running "):
        line = proc.stdout.readline()
    assert line.startswith("running "), proc.stderr.read()


def fail_rank_one(proc, how: str, timeout: float) -> float | None:
    """Kill ("killed") or stop ("stopped") rank 1 of torchrun `proc`. For a stopped rank, wait
    until rank 0 gives up on its own (at most timeout + 30 s), then free the stopped rank
    (torchrun would wait 30 s before killing a process that ignores SIGTERM) and return the
    seconds rank 0 took; None for a killed rank."""
    time.sleep(0.5)
    victim = workers(proc.pid)[1]
    os.kill(victim, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    if how != "stopped":
        return None
    began = time.monotonic()
    while time.monotonic() - began < timeout + 30 and 0 in workers(proc.pid):
        time.sleep(0.2)
    waited = time.monotonic() - began
    os.kill(victim, signal.SIGKILL)
    return waited


def spawn_ranks(target, world: int, args: tuple, timeout: float) -> list:
    """Start `world` spawned processes running target(rank, *args), wait up to `timeout` s for
    each, kill any still alive; their exit codes in rank order (None for a killed one)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, *args)) for r in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=timeout)
    codes = [proc.exitcode for proc in procs]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    return codes


def sgd_against_one_process(program, model, options, steps: int = 2, lr: float = 0.5):
    """Run `steps` steps of `program` with SGD after each on this rank's stage, and the same on
    one process's copy of the whole model (made before the stages are split) on the full batch.
    Returns the largest relative difference of any parameter (tensor-parallel ones gathered whole)
    and the session's parameters sorted by name, read before the session is finished."""
    import copy

    import torch
    from torch.distributed.tensor import DTensor

    from runtime import Session

    full = copy.deepcopy(model.full_module())
    reference = torch.optim.SGD(full.parameters(), lr=lr)
    for _ in range(steps):
        reference.zero_grad()
        model.loss(full(model.inputs), model.targets).backward()
        reference.step()
    want = dict(full.named_parameters())
    with Session(program, model, options) as session:
        local = torch.optim.SGD([p for _, p in session.named_parameters()], lr=lr)
        for _ in range(steps):
            session.step()
            local.step()
        params = sorted(session.named_parameters(), key=lambda item: item[0])
        whole = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for n, p in params}
        error = max(float((whole[n] - want[n].detach()).abs().max() / want[n].detach().abs().max()) for n in whole)
        session.finish()
    return error, params


def assert_peer_failure_named(stderr: str, first_line: str, how: str, timeout: float) -> None:
    """Rank 0's first error line of `stderr` matches the regex `first_line` and says how its peer
    failed: "killed" (the connection closed) or stopped (nothing within the `timeout`)."""
    import re

    lines = [line for line in stderr.splitlines() if re.match(r"(rank \d+: )?error: ", line)]
    assert lines, stderr
    assert re.fullmatch(first_line, lines[0]), lines
    if how == "killed":
        assert "closed the connection" in lines[0]
    else:
        assert f"nothing arrived within the {timeout} s timeout" in lines[0]
