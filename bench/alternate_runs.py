"""Several executor runs in one launch, their steps alternated, so that every run sees the same machine.

    torchrun --nproc-per-node P bench/alternate_runs.py PLAN.json

On a shared machine whose speed drifts by tens of percent from one second to the next
(bench/machine_drift.py), two runs launched a minute apart are measured on two different
machines, and no cost model can predict one from the other closer than that drift. Here every
run of PLAN is opened at once (`runtime.Session`, each with its own model and groups) and
their steps are dealt out in one interleaved order: run i's k-th step at the fraction
(k + 1/2) / steps_i of the launch, so that each run's steps spread over the whole launch
whatever its step count, and a slow second of the machine falls on every run alike. Warm-up
steps go first, in the same way. A turn would otherwise begin on caches the previous run filled:
with REWARM > 0 each turn first takes that many unmeasured steps of its run, so that its measured
step starts as a step of a run alone does, on its own warm caches. Each run then writes the directory `python -m runtime
--out` writes (timeline, memory, program, summary and, where asked, profile.json), which
`sim calibrate` and `sim compare` read as they read any other run.

PLAN.json: {"model": {ModelSpec fields but batch_size}, "warmup": W, "rewarm": REWARM, "runs": [{"out": DIR,
"schedule": NAME, "microbatches": M, "chunks": V or null, "batch_size": B, "steps": S,
"profile": true|false}, ...]}. Used by bench/fidelity.py --alternate.
"""

from __future__ import annotations

import datetime
import gc
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.distributed as dist  # noqa: E402

import schedules  # noqa: E402
from runtime import ConfigError, ModelSpec, RunOptions, Session, build_model, write_outputs  # noqa: E402
from runtime.profile import collect, write_profile  # noqa: E402

TIMEOUT = 300.0


class PlanError(ValueError):
    """PLAN.json cannot be read as a plan of runs."""


@dataclass(frozen=True)
class RunPlan:
    """One run of the launch: where it writes, what it runs, how many measured steps."""

    out: Path
    schedule: str
    microbatches: int
    chunks: int | None
    batch_size: int
    steps: int
    profile: bool


def read_plan(path: Path) -> tuple[dict, int, int, list[RunPlan]]:
    """(model flags, warm-up steps, unmeasured steps per turn, runs) from PLAN.json."""
    try:
        plan = json.loads(path.read_text())
        runs = [RunPlan(Path(r["out"]), r["schedule"], int(r["microbatches"]), r.get("chunks"), int(r["batch_size"]),
                        int(r["steps"]), bool(r.get("profile", False))) for r in plan["runs"]]
        model, warmup, rewarm = dict(plan["model"]), int(plan.get("warmup", 0)), int(plan.get("rewarm", 0))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlanError(f"{path}: not a plan of runs ({type(exc).__name__}: {exc})") from None
    if not runs or any(r.steps < 1 for r in runs) or warmup < 0 or rewarm < 0:
        raise PlanError(f"{path}: needs at least one run, each of at least one step, and warm-up steps of 0 or more")
    return model, warmup, rewarm, runs


def step_order(steps: list[int]) -> list[int]:
    """Which run takes each turn: run i's k-th step at (k + 1/2) / steps[i] of the launch, ties
    broken by run, so that every run's steps spread evenly over the whole launch."""
    slots = sorted(((k + 0.5) / n, i) for i, n in enumerate(steps) for k in range(n))
    return [i for _, i in slots]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: torchrun --nproc-per-node P bench/alternate_runs.py PLAN.json", file=sys.stderr)
        return 2
    try:
        model_flags, warmup, rewarm, runs = read_plan(Path(argv[0]))
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT))
    rank = dist.get_rank()
    sessions: list[Session] = []  # one per run, in the plan's order
    try:
        for r in runs:
            spec = ModelSpec(**model_flags, batch_size=r.batch_size)
            spec.check()
            model = build_model(spec)
            schedule = schedules.build(r.schedule, ranks=dist.get_world_size(), microbatches=r.microbatches,
                                       chunks=r.chunks)
            session = Session(schedules.lower(schedule), model, RunOptions(steps=r.steps, warmup=warmup, timeout=TIMEOUT))
            sessions.append(session)
    except (ConfigError, schedules.ScheduleError, TypeError) as exc:  # TypeError: a model flag ModelSpec lacks
        print(f"rank {rank}: error: {exc}", file=sys.stderr)
        for session in sessions:
            session.close()
        dist.destroy_process_group()
        return 2
    for i in step_order([warmup] * len(runs)):
        sessions[i].step(measured=False)
    for i in step_order([r.steps for r in runs]):
        for _ in range(rewarm):
            sessions[i].step(measured=False)
        sessions[i].step()
    for r, session in zip(runs, sessions):
        result = session.finish()
        plan = session.plan
        profile = collect(plan.program, plan.model, session.device, layers=True, p2p=True) if r.profile else None
        if rank == 0:
            if profile:
                write_profile(r.out, profile)  # before summary.json, which marks a run directory complete
            write_outputs(result, plan.program, r.out)
    gc.collect()  # see runtime/cli.py: free reference cycles before gloo's threads go
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
