"""The parts of bench/gpu_check.sh that are Python: the environment probe and the report.

    python bench/gpu_check_report.py env OUT/env.json     # prints the number of GPUs
    python bench/gpu_check_report.py report OUT           # reads OUT, writes tables, prints the report

`report` reads what the script left under OUT: ``env.json``, ``steps.tsv`` (one line per
step: name, role, exit code (-1: not run), seconds), ``runs/NAME/`` (executor run directories),
``logs/NAME.log``, ``calibration.json`` and ``compare-NAME.json``. It writes
``checks.csv`` (--check runs: verdict, largest relative gradient error, loss error),
``predictions.csv`` (held-out runs: measured vs simulated step time, makespan, bubble
ratio), ``memory.csv`` (per run and rank: torch.cuda.max_memory_allocated against the
simulator's peak, sim.device_memory, with its parts), ``summary.json`` (all of it) and
``report.txt`` (what it prints). Exit code 0 when every step ran and every check passed.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ROLES = ("check", "calibrate", "heldout", "sim")
NOT_RUN = -1  # steps.tsv exit code of a step the script skipped: its time budget was spent


@dataclass(frozen=True)
class Step:
    """One command the script ran: its name, role (ROLES), exit code and wall seconds."""

    name: str
    role: str
    code: int
    seconds: float


@dataclass(frozen=True)
class CheckRow:
    """A --check run: PASSED, FAILED (gradients differ) or ERROR (the run did not finish)."""

    name: str
    schedule: str
    ranks: int | None
    microbatches: int | None
    chunks: int | None
    verdict: str
    max_relative_error: float | None
    worst_parameter: str | None
    loss_relative_error: float | None
    tolerance: float | None
    detail: str


@dataclass(frozen=True)
class PredictionRow:
    """A held-out run against the simulator calibrated on another run."""

    name: str
    schedule: str
    ranks: int
    microbatches: int
    chunks: int
    step_time_measured: float
    step_time_simulated: float
    step_time_error: float
    makespan_error: float
    start_mae: float
    bubble_ratio_measured: float
    bubble_ratio_simulated: float


@dataclass(frozen=True)
class MemoryRow:
    """One rank of one run: measured peak (None without CUDA), predicted peak and its parts."""

    name: str
    rank: int
    measured: int | None
    predicted: int
    weights: int
    gradients: int
    batch: int
    activations: int
    receive_buffers: int
    send_buffers: int

    @property
    def error(self) -> float | None:
        """Signed relative error of the prediction, (predicted - measured) / measured."""
        if not self.measured:
            return None
        return (self.predicted - self.measured) / self.measured


# ------------------------------------------------------------------------ environment
def environment() -> dict[str, Any]:
    """GPU count and model, torch, CUDA and NCCL versions of this machine."""
    import torch

    gpus = torch.cuda.device_count()
    nccl = None
    if gpus:
        version = torch.cuda.nccl.version()
        nccl = ".".join(str(x) for x in version) if isinstance(version, tuple) else str(version)
    return {
        "gpus": gpus,
        "device": torch.cuda.get_device_name(0) if gpus else (platform.processor() or platform.machine() or "cpu"),
        "backend": "nccl" if gpus else "gloo",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


# ----------------------------------------------------------------------------- parsing
def read_steps(path: Path) -> list[Step]:
    """steps.tsv: name, role, exit code, seconds per line (a missing file: no steps)."""
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        name, role, code, seconds = line.split("\t")
        if role not in ROLES:
            raise ValueError(f"{path}: unknown role {role!r} in {line!r}")
        steps.append(Step(name, role, int(code), float(seconds)))
    return steps


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None if the file is missing or not a complete JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def last_error(log: Path) -> str:
    """The line that says why a run failed: the last line naming an error, else the last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    for line in reversed(lines):
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "empty log"


def check_row(name: str, summary: dict[str, Any] | None, log: Path) -> CheckRow:
    """The verdict of a --check run from its summary.json (None: the run did not finish)."""
    if summary is None or "check" not in summary:
        return CheckRow(name, name, None, None, None, "ERROR", None, None, None, None, last_error(log))
    check = summary["check"]
    missing = check.get("parameters_missing") or []
    return CheckRow(
        name=name, schedule=summary["schedule"], ranks=summary["ranks"], microbatches=summary["microbatches"],
        chunks=summary["chunks"], verdict="PASSED" if check["passed"] else "FAILED",
        max_relative_error=check["max_relative_error"], worst_parameter=check["worst_parameter"],
        loss_relative_error=check["loss_relative_error"], tolerance=check["tolerance"],
        detail=f"no gradient for {', '.join(missing)}" if missing else "",
    )


def prediction_row(name: str, comparison: dict[str, Any]) -> PredictionRow:
    """A held-out run's numbers from `sim compare --measured --json`."""
    return PredictionRow(
        name=name, schedule=comparison["schedule"], ranks=comparison["ranks"],
        microbatches=comparison["microbatches"], chunks=comparison["chunks"],
        step_time_measured=comparison["step_time_measured"], step_time_simulated=comparison["step_time_simulated"],
        step_time_error=comparison["step_time_error"], makespan_error=comparison["makespan_error"],
        start_mae=comparison["start_mae"], bubble_ratio_measured=comparison["bubble_ratio_measured"],
        bubble_ratio_simulated=comparison["bubble_ratio_simulated"],
    )


def memory_rows(name: str, run_dir: Path, calibration: Path | None) -> list[MemoryRow]:
    """Per rank of a run: measured peak CUDA memory and the simulator's predicted peak.

    Activation bytes come from the calibration (its cost model for this run's stages),
    else from the run itself; weights, batch and receive posting from its summary.json.
    """
    from sim.device_memory import ExecutorMemory, peak_device_memory
    from sim.measured import read_measured
    from sim.sources import costs_for_run

    run = read_measured(run_dir)
    costs = costs_for_run(calibration if calibration is not None and calibration.is_file() else None, run).costs
    summary = run.summary
    executor = ExecutorMemory(
        weight_bytes=tuple(int(s["param_bytes"]) for s in summary["stage_costs"]),
        batch_bytes=int(summary["batch_bytes"]),
        post_ahead=summary.get("post_ahead", 0),
    )
    measured = summary.get("peak_cuda_allocated_bytes") or [None] * run.program.schedule.ranks
    return [
        MemoryRow(name, d.rank, None if m is None else int(m), d.peak, d.weights, d.gradients, d.batch,
                  d.activations, d.receive_buffers, d.send_buffers)
        for d, m in zip(peak_device_memory(run.program, costs, executor), measured)
    ]


# ----------------------------------------------------------------------------- report
def _shape(schedule: str, ranks, microbatches, chunks) -> str:
    if ranks is None:
        return schedule
    return f"{schedule} p={ranks} m={microbatches}" + (f" v={chunks}" if chunks and chunks > 1 else "")


def _outcome(code: int) -> str:
    """What a step's exit code says: -1 not run (budget spent), 124/137 killed at its time limit."""
    if code == NOT_RUN:
        return "not run (time budget spent)"
    if code in (124, 137):
        return f"timed out (exit {code})"
    return f"exited {code}"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def size(x: int | None) -> str:
    """Bytes in the largest binary unit that keeps the number at 1 or more: '1.50 GiB', '512 B'."""
    if x is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x} B"


def format_report(env: dict[str, Any], steps: Sequence[Step], checks: Sequence[CheckRow],
                  predictions: Sequence[PredictionRow], memory: Sequence[MemoryRow], calibrated_on: str | None,
                  out: Path) -> str:
    """The short report the script prints (and writes to report.txt)."""
    device = f"{env['gpus']} x {env['device']}" if env.get("gpus") else f"no GPU ({env.get('device')}, CPU fallback)"
    lines = [
        f"GPU check: {device}; backend {env.get('backend')}; torch {env.get('torch')}, "
        f"CUDA {env.get('cuda') or '-'}, NCCL {env.get('nccl') or '-'}",
        f"steps: {sum(s.code == 0 for s in steps)} of {len(steps)} ran cleanly in {sum(s.seconds for s in steps):.0f} s"
        + "".join(f"; {s.name} {_outcome(s.code)}" for s in steps if s.code != 0),
        "checks (--check against one process on the full batch):",
    ]
    for c in checks:
        lines.append(
            f"  {c.name:<20} {_shape(c.schedule, c.ranks, c.microbatches, c.chunks):<26} {c.verdict:<6} "
            f"grad {_num(c.max_relative_error, '.2e')} loss {_num(c.loss_relative_error, '.2e')}"
            + (f"  ({c.detail})" if c.detail else "")
        )
    if not checks:
        lines.append("  none")
    lines.append(f"predictions (calibrated on {calibrated_on or 'nothing: calibration failed'}):")
    for p in predictions:
        lines.append(
            f"  {p.name:<20} {_shape(p.schedule, p.ranks, p.microbatches, p.chunks):<26} step "
            f"{p.step_time_measured * 1e3:.2f} ms measured, {p.step_time_simulated * 1e3:.2f} simulated "
            f"({p.step_time_error * 100:+.1f}%); makespan {p.makespan_error * 100:+.1f}%; start MAE "
            f"{p.start_mae * 100:.1f}%; bubble {p.bubble_ratio_measured:.3f} vs {p.bubble_ratio_simulated:.3f}"
        )
    if not predictions:
        lines.append("  none")
    lines.append("peak memory per rank: measured torch.cuda.max_memory_allocated vs predicted "
                 "= weights + gradients + batch + activations + receive buffers + sent tensors:")
    for r in memory:
        error = "" if r.error is None else f" ({r.error * 100:+.1f}%)"
        lines.append(
            f"  {r.name:<20} rank {r.rank}: {size(r.measured)} vs {size(r.predicted)}{error} = "
            + " + ".join(size(x) for x in (r.weights, r.gradients, r.batch, r.activations, r.receive_buffers,
                                           r.send_buffers))
        )
    if not memory:
        lines.append("  none")
    lines.append(f"wrote {out}/ (summary.json, checks.csv, predictions.csv, memory.csv, report.txt, runs/, logs/, "
                 "calibration.json, compare-*.json, overlay-*.png)")
    return "\n".join(lines)


def _write_csv(path: Path, rows: Sequence[Any], extra: dict[str, str] | None = None) -> None:
    with open(path, "w", newline="") as f:
        if not rows:
            return
        fields = list(asdict(rows[0]))
        names = fields + list(extra or {})
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for row in rows:
            record = asdict(row)
            for column, attribute in (extra or {}).items():
                record[column] = getattr(row, attribute)
            writer.writerow(record)


def report(out: Path) -> int:
    """Read the script's outputs under `out`, write the tables and report; 0 if all went well."""
    env = read_json(out / "env.json") or {}
    steps = read_steps(out / "steps.tsv")
    runs, logs = out / "runs", out / "logs"
    checks = [check_row(s.name, read_json(runs / s.name / "summary.json"), logs / f"{s.name}.log")
              for s in steps if s.role == "check"]
    calibration = out / "calibration.json"
    cal = read_json(calibration)
    calibrated_on = None
    if cal is not None and "source" in cal:
        src = cal["source"]
        calibrated_on = f"{_shape(src['schedule'], src['ranks'], src['microbatches'], src['chunks'])} ({src['run']})"
    predictions = []
    for s in steps:
        comparison = read_json(out / f"compare-{s.name}.json") if s.role == "heldout" else None
        if comparison is not None:
            predictions.append(prediction_row(s.name, comparison))
    memory: list[MemoryRow] = []
    problems = []
    for s in steps:
        if s.role in ("calibrate", "heldout") and (runs / s.name / "summary.json").is_file():
            try:
                memory += memory_rows(s.name, runs / s.name, calibration if cal is not None else None)
            except Exception as exc:  # a report must come out whatever one run holds
                problems.append(f"memory of {s.name}: {type(exc).__name__}: {exc}")
    text = format_report(env, steps, checks, predictions, memory, calibrated_on, out)
    if problems:
        text += "\n" + "\n".join(f"problem: {p}" for p in problems)
    _write_csv(out / "checks.csv", checks)
    _write_csv(out / "predictions.csv", predictions)
    _write_csv(out / "memory.csv", memory, {"error": "error"})
    (out / "summary.json").write_text(json.dumps({
        "environment": env,
        "steps": [asdict(s) for s in steps],
        "checks": [asdict(c) for c in checks],
        "calibrated_on": calibrated_on,
        "predictions": [asdict(p) for p in predictions],
        "memory": [asdict(r) | {"error": r.error} for r in memory],
        "problems": problems,
    }, indent=1) + "\n")
    (out / "report.txt").write_text(text + "\n")
    print(text)
    healthy = all(s.code == 0 for s in steps) and all(c.verdict == "PASSED" for c in checks) and not problems
    return 0 if steps and healthy else 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("env", "report"):
        print("usage: gpu_check_report.py env OUT/env.json | report OUT", file=sys.stderr)
        return 2
    if args[0] == "env":
        env = environment()
        Path(args[1]).write_text(json.dumps(env, indent=1) + "\n")
        print(env["gpus"])
        return 0
    out = Path(args[1])
    if not out.is_dir():
        print(f"gpu_check_report: error: {out} is not a directory", file=sys.stderr)
        return 2
    return report(out)


if __name__ == "__main__":
    sys.exit(main())
