"""Rank 0's view of a run: the gathered timeline and memory tables, metrics, the output files.

Measured rows follow schedules.timeline: a RECV runs from the rank reaching it to the
data being there; a SEND from its posting to its delivery, i.e. the end of the matching
RECV on the receiver (neither gloo nor NCCL lets the sender observe delivery without
blocking), never before its own start. Where every rank read one host clock
(runtime.clock) the rows are put on it, from the earliest rank's step start
(``clocks: "host"`` in summary.json); else each rank's from its own (``clocks: "rank"``). Memory rows give, per rank, the bytes saved for
backward at the step start and after every compute action; on GPU, cuda_memory.csv
(same schema) gives torch.cuda.memory_allocated after every compute action.

cpu.csv (schedules.timeline's CPU table, measured runs only) gives each compute action's own
CPU time: step, rank, action (its text, as in the timeline) and thread_cpu, the seconds of CPU
its rank's thread used from the row's start to its end (time.thread_time). Where ranks share cores it
tells an action's cost on a core from the time it waited for one, which the row's wall time
holds as well; on GPU it is the host's launching. summary.json's ``process_cpu_seconds``
gives, per rank and measured step, the CPU seconds of the rank's whole process (every
thread: the transport's too) over the step's stream.

With data or tensor parallelism (`runtime.layout`), the tables and per-stage costs are
those of the pipeline at dp = tp = 0, whose rank column is the pipeline rank (the
schedule's), as in the simulator; --check reads every rank, and summary.json records the
layout.

Metrics are the simulator's, per measured step (schedules.timeline.step_metrics defines
them for both), then the median over steps: makespan, bubble_ratio and the zero-bubble
paper's bubble_ratio_rank_span (longest rank span minus the busiest rank's compute, over
that span).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd
import torch

import schedules
from schedules.ir import COMPUTE_NAMES, RECV_NAMES, SEND_NAMES
from schedules.timeline import CPU_COLUMNS, memory_frame, step_metrics, timeline_frame

from . import host
from .clock import __doc__ as CLOCK_DOC
from .layout import MESH_DIMS

SUMMARY = "summary.json"


@dataclass(frozen=True, eq=False)
class RunResult:
    """One rank's view of a run; `summary`, `timeline` and `memory` are set on rank 0 only."""

    rank: int
    passed: bool | None  # --check verdict, the same on every rank; None without --check
    summary: dict[str, Any] | None = None
    timeline: Any = None  # pandas DataFrame, schema of schedules.timeline
    memory: Any = None  # saved-for-backward bytes (memory schema of schedules.timeline)
    cuda_memory: Any = None  # on GPU: torch.cuda.memory_allocated, same schema
    cpu: Any = None  # pandas DataFrame of CPU_COLUMNS: each compute action's thread CPU seconds


def gather(plan, payloads: list[dict[str, Any]], backend: str, device: torch.device) -> RunResult:
    """Rank 0's RunResult from every rank's payload: tables, summary dict and --check verdict."""
    program = plan.program
    schedule = program.schedule
    everyone = payloads
    # The tables are one pipeline's: the replica at dp = tp = 0, indexed by pipeline rank.
    payloads = sorted((p for p in payloads if tuple(p["coords"][1:]) == (0, 0)), key=lambda p: p["rank"])
    # Payload rows end in (peer, start, end); the schema wants (start, end, peer, source).
    timeline = timeline_frame(
        (*row[:7], row[8], row[9], row[7], "measured") for p in payloads for row in p["timeline"]
    )
    memory = memory_frame((*row, "measured") for p in payloads for row in p["memory"])
    offsets = host_clock_offsets(payloads)
    if offsets is not None:
        on_host_clock(timeline, memory, offsets)
    set_delivery_times(timeline, program)
    cuda_rows = [(*row, "measured") for p in payloads for row in p["cuda_memory"]]
    cuda_memory = memory_frame(cuda_rows) if cuda_rows else None
    cpu = pd.DataFrame([row for p in payloads for row in p["cpu"]], columns=list(CPU_COLUMNS))
    metrics = step_metrics(timeline, schedule.ranks)
    step_times = payloads[0]["step_times"]
    stages = []
    for s in range(schedule.num_stages):
        owner = payloads[schedule.stage_to_rank[s]]
        layers = plan.layers[s]
        entry = {
            "stage": s,
            "rank": schedule.stage_to_rank[s],
            "chunk": schedule.chunk_of(s),
            "layers": [layers.start, layers.stop],
            "params": owner["params"][s],
            "param_bytes": owner["param_bytes"][s],
            "output_bytes_per_microbatch": owner["boundaries"].get(s),
        }
        entry.update(
            {
                (f"{k}_seconds" if k in COMPUTE_NAMES else k): v
                for k, v in owner["stages"][s].items()
            }
        )
        stages.append(entry)
    loss = replica_loss(everyone)
    summary: dict[str, Any] = {
        "schedule": schedule.name,
        "ranks": schedule.ranks,
        "microbatches": schedule.microbatches,
        "chunks": schedule.chunks,
        "layout": {"pp": plan.layout.pp, "dp": plan.layout.dp, "tp": plan.layout.tp,
                   "mesh_dims": list(MESH_DIMS), "world_size": plan.layout.size},
        "placement": schedule.placement,
        "stages": schedule.num_stages,
        "model": dict(plan.model.flags),
        "batch_size": plan.model.batch_size,
        "microbatch_sizes": list(plan.sizes),
        "steps": len(step_times),
        "warmup": payloads[0]["warmup_steps"],
        "step_time_median": median(step_times),
        "step_times": step_times,
        "makespan_median": median(metrics["makespan"]),
        "bubble_ratio": median(metrics["bubble_ratio"]),
        "bubble_ratio_rank_span": median(metrics["bubble_ratio_rank_span"]),
        "peak_activation_bytes": [p["peak_bytes"] for p in payloads],
        "process_cpu_seconds": [p["process_cpu"] for p in payloads],
        "peak_cuda_allocated_bytes": [p["peak_cuda_bytes"] for p in payloads] if device.type == "cuda" else None,
        "batch_bytes": payloads[0]["batch_bytes"],  # inputs and targets, held on every rank
        # CPU: whether malloc kept freed activations for the next step (runtime.allocator), None on GPUs
        "freed_memory": payloads[0]["freed_memory"],
        "parameter_bytes": parameter_bytes(plan.model),
        "loss": loss,
        "stage_costs": stages,
        "backend": backend,
        "transport": plan.options.transport or ("ordered" if backend == "nccl" else "tagged"),
        "post_ahead": plan.options.resolved_post_ahead(backend),
        "device": device.type if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        # Ranks of one host share its cores (the simulator's CostModel.cores); rank 0's host
        # stands for every host.
        "cpu_cores": host.cores(),
        "local_world_size": host.local_world_size(plan.layout.size),
        "python": platform.python_version(),
        "timeout_seconds": plan.options.timeout,
        "clocks": "rank" if offsets is None else "host",
        # per measured step, each pipeline rank's step start on that clock (seconds)
        "rank_step_starts": None if offsets is None else [[o[r] for r in sorted(o)] for o in offsets],
        "clock_alignment": " ".join(CLOCK_DOC.split()),
    }
    passed = None
    if plan.options.check:
        summary["check"] = check = _verdict(everyone, plan.options.tolerance)
        passed = check["passed"]
    return RunResult(rank=0, passed=passed, summary=summary, timeline=timeline, memory=memory, cuda_memory=cuda_memory,
                     cpu=cpu)


def parameter_bytes(model) -> dict[str, Any]:
    """Bytes of the whole model's parameters (= of their gradients) by unit: what a stage's
    REDUCE_GRAD all-reduces is the sum over its units, for any cut of the model."""
    def size(module) -> int:
        return 0 if module is None else sum(p.numel() * p.element_size() for p in module.parameters())

    return {"prologue": size(model.prologue), "layers": [size(layer) for layer in model.layers],
            "epilogue": size(model.epilogue)}


def host_clock_offsets(payloads: list[dict[str, Any]]) -> list[dict[int, float]] | None:
    """Per measured step, per rank: seconds from the earliest rank's step start to the rank's,
    on the host's monotonic clock (runtime.clock); None unless every payload's step starts were
    read on one such clock (CPU ranks of one host)."""
    clock = {p.get("clock_id") for p in payloads}
    origins = [p.get("origins") or [] for p in payloads]
    steps = {len(o) for o in origins}
    if len(clock) != 1 or None in clock or len(steps) != 1 or any(t is None for o in origins for t in o):
        return None
    offsets = []
    for step in range(steps.pop()):
        first = min(o[step] for o in origins)
        offsets.append({p["rank"]: (o[step] - first) / 1e9 for p, o in zip(payloads, origins)})
    return offsets


def on_host_clock(timeline, memory, offsets: list[dict[int, float]]) -> None:
    """Move every rank's rows of each step by its offset (`host_clock_offsets`): one clock."""
    for frame, columns in ((timeline, ["start", "end"]), (memory, ["time"])):
        shift = [offsets[step][rank] for step, rank in zip(frame["step"], frame["rank"])]
        for column in columns:
            frame[column] = frame[column] + shift


def set_delivery_times(timeline, program) -> None:
    """Set every SEND's end to its delivery: the end of its transfer's RECV (not before its start)."""
    transfer_of = {str(a): a.transfer for stream in program.streams for a in stream if a.kind.is_comm}
    recvs = timeline[timeline["kind"].isin(RECV_NAMES)]
    arrived = {(step, transfer_of[action]): end for step, action, end in zip(recvs["step"], recvs["action"], recvs["end"])}
    sends = timeline.index[timeline["kind"].isin(SEND_NAMES)]
    for i in sends:
        key = (timeline.at[i, "step"], transfer_of[timeline.at[i, "action"]])
        timeline.at[i, "end"] = max(timeline.at[i, "start"], arrived[key])


def _verdict(payloads: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    errors: dict[str, float] = {}
    for p in payloads:  # with data parallelism every replica holds each name: keep the worst
        for name, error in p["check"]["errors"].items():
            errors[name] = max(error, errors.get(name, error))
    expected = payloads[0]["check"]["names"]
    missing = sorted(set(expected) - set(errors))
    loss, reference_loss = replica_loss(payloads), payloads[0]["check"]["reference_loss"]
    loss_error = None if loss is None else abs(loss - reference_loss) / max(abs(reference_loss), 1e-30)
    worst = max(errors, key=errors.get) if errors else None
    max_error = errors[worst] if worst else 0.0
    # Data-parallel replicas (same pp and tp coordinates) must hold identical gradients.
    digests: dict[tuple[int, int], set[str]] = {}
    for p in payloads:
        digests.setdefault((p["coords"][0], p["coords"][2]), set()).add(p["check"]["grad_digest"])
    identical = all(len(d) == 1 for d in digests.values())
    passed = not missing and identical and loss_error is not None and max(max_error, loss_error) <= tolerance
    return {
        "passed": passed,
        "tolerance": tolerance,
        "max_relative_error": max_error,
        "worst_parameter": worst,
        "loss_relative_error": loss_error,
        "parameters_checked": len(errors),
        "parameters_missing": missing,
        "replicas_identical": identical,
    }


def replica_loss(payloads: list[dict[str, Any]]) -> float | None:
    """The batch's mean loss: the mean over data-parallel replicas (equal shares) of their last
    stage's loss, read at tp = 0; None without one."""
    losses = [p["loss"] for p in payloads if p["loss"] is not None and p["coords"][2] == 0]
    return sum(losses) / len(losses) if losses else None


def clear_summary(out: str | Path) -> None:
    """Remove a previous run's summary.json, so a failed run never looks complete."""
    path = Path(out) / SUMMARY
    if path.exists():
        path.unlink()


def write_outputs(result, program, out: str | Path) -> None:
    """timeline.csv, memory.csv, cpu.csv (and cuda_memory.csv on GPU), program.json, then
    summary.json (last, atomically)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result.timeline.to_csv(out / "timeline.csv", index=False)
    result.memory.to_csv(out / "memory.csv", index=False)
    if result.cuda_memory is not None:
        result.cuda_memory.to_csv(out / "cuda_memory.csv", index=False)
    if result.cpu is not None:
        result.cpu.to_csv(out / "cpu.csv", index=False)
    schedules.save_json(program, out / "program.json")
    handle, tmp = tempfile.mkstemp(dir=out, prefix=".summary.", suffix=".json")
    with os.fdopen(handle, "w") as f:
        json.dump(result.summary, f, indent=1)
        f.write("\n")
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the other outputs are not
    os.replace(tmp, out / SUMMARY)


def format_summary(summary: dict[str, Any]) -> str:
    """The one-screen summary rank 0 prints."""
    lines = [
        f"{summary['schedule']}: p={summary['ranks']} m={summary['microbatches']} v={summary['chunks']} "
        f"({summary['placement']} placement), model {summary['model']}",
        f"backend {summary['backend']} on {summary['device']}, torch {summary['torch_version']}",
        f"step time median {summary['step_time_median'] * 1e3:.2f} ms over {summary['steps']} steps "
        f"(after {summary['warmup']} warm-up)",
        f"bubble ratio {summary['bubble_ratio']:.3f} (rank-span {summary['bubble_ratio_rank_span']:.3f})",
        "peak activation bytes per rank: " + ", ".join(f"{b:,}" for b in summary["peak_activation_bytes"]),
    ]
    if summary.get("loss") is not None:
        lines.append(f"loss {summary['loss']:.6g}")
    for st in summary["stage_costs"]:
        times = "  ".join(
            f"{k} {st[f'{k}_seconds'] * 1e3:.3f} ms" for k in COMPUTE_NAMES if f"{k}_seconds" in st
        )
        lines.append(f"  stage {st['stage']} (rank {st['rank']}, layers {st['layers'][0]}..{st['layers'][1] - 1}): {times}")
    check = summary.get("check")
    if check is not None:
        verdict = "PASSED" if check["passed"] else "FAILED"
        lines.append(
            f"check {verdict}: largest relative gradient error {check['max_relative_error']:.3g} "
            f"({check['worst_parameter']}), loss error {check['loss_relative_error']:.3g}, "
            f"tolerance {check['tolerance']:g}"
            + (f"; no gradient for {', '.join(check['parameters_missing'])}" if check["parameters_missing"] else "")
            + ("" if check["replicas_identical"] else "; data-parallel replicas hold different gradients")
        )
    return "\n".join(lines)
