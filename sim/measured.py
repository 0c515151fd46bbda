"""A measured run directory, read once, for plots, comparisons and calibration.

What ``python -m runtime`` writes (runtime/record.py): ``timeline.csv`` and
``memory.csv`` (schema of schedules.timeline, one block of rows per measured step),
``program.json`` (the lowered program that ran), ``summary.json`` (sizes, model flags,
``step_times`` barrier to barrier, ``stage_costs`` with each stage's layer range,
``peak_activation_bytes`` per rank, ``post_ahead``, ``process_cpu_seconds``, ...),
``cpu.csv`` (each compute action's thread CPU time; runs from before it lack it) and, with
``--profile-layers`` or ``--profile-p2p``, ``profile.json`` (runtime/profile.py).

`read_run` reads the tables and the summary, which is all a plot needs; the program is
read from program.json when first asked for. `MeasuredRun.checked` (and `read_measured`,
which reads and checks) makes sure the files agree, as simulating or calibrating needs:
every measured step holds every action of the program once, in stream order on its rank,
with finite times; the summary's sizes are the program's. A missing, truncated or
malformed file is a ScheduleError with one line naming the file and what is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from schedules import Program, ScheduleError, load_program_json
from schedules.io import read_json
from schedules.ir import COMPUTE_NAMES, SPLIT_FORWARD
from schedules.posting import PostAhead
from schedules.stages import ROLES
from schedules.timeline import CPU_COLUMNS, check_timeline, read_table, step_metrics

REQUIRED = ("timeline.csv", "memory.csv", "summary.json")
PROFILE = "profile.json"
CPU = "cpu.csv"


@dataclass(frozen=True, eq=False)
class MeasuredRun:
    """A run directory: its tables and summary; its program and profile when asked for."""

    path: Path
    timeline: pd.DataFrame = field(repr=False)
    memory: pd.DataFrame = field(repr=False)
    summary: dict[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        """The schedule's name from summary.json, else the directory name."""
        return str(self.summary.get("schedule") or self.path.name)

    @cached_property
    def program(self) -> Program:
        """The program the run executed, from its program.json (read once)."""
        path = self.path / "program.json"
        if not path.is_file():
            raise ScheduleError(f"run directory {self.path} lacks program.json (needed to simulate the run)")
        return load_program_json(path)

    @cached_property
    def profile(self) -> dict[str, Any] | None:
        """profile.json, checked for the fields calibration reads; None if there is none."""
        return read_profile(self.path / PROFILE)

    def checked(self) -> "MeasuredRun":
        """This run, after checking that its program, summary, timeline and profile agree."""
        program = self.program
        _check_summary(self.summary, program, self.path / "summary.json")
        _check_timeline(self.timeline, program, len(self.summary["step_times"]), self.path / "timeline.csv")
        self.profile  # noqa: B018  (reading it checks it)
        return self

    @cached_property
    def cpu(self) -> pd.DataFrame | None:
        """cpu.csv (schedules.timeline's CPU table: each compute action's thread CPU seconds),
        None for a run from before it; read once."""
        path = self.path / CPU
        if not path.is_file():
            return None
        try:
            frame = pd.read_csv(path)
        except (ValueError, OSError) as exc:
            raise ScheduleError(f"{path} cannot be read: {exc}") from None
        missing = [c for c in CPU_COLUMNS if c not in frame.columns]
        if missing:
            raise ScheduleError(f"{path} lacks the columns {', '.join(missing)}")
        seconds = pd.to_numeric(frame["thread_cpu"], errors="coerce")
        if not (np.isfinite(seconds) & (seconds >= 0)).all():
            raise ScheduleError(f"{path}: thread_cpu must be non-negative seconds")
        return frame.assign(thread_cpu=seconds)

    @cached_property
    def thread_cpu(self) -> pd.Series | None:
        """Each compute row's thread CPU seconds (cpu.csv joined on step, rank and action), indexed
        as the timeline's rows; None for a run from before cpu.csv."""
        return None if self.cpu is None else thread_cpu(self.timeline, self.cpu)

    @property
    def steps(self) -> list[int]:
        return sorted(int(s) for s in self.timeline["step"].unique())

    @property
    def step_times(self) -> list[float]:
        """Barrier-to-barrier wall time of each measured step (rank 0's clock)."""
        return [float(t) for t in self.summary["step_times"]]

    @property
    def step_time_median(self) -> float:
        return float(np.median(self.step_times))

    @property
    def stage_layers(self) -> tuple[tuple[int, int], ...]:
        """Per stage, its [first, last + 1) layer range."""
        return tuple((int(s["layers"][0]), int(s["layers"][1])) for s in self.summary["stage_costs"])

    @property
    def rows(self) -> int:
        """Samples in the largest microbatch (the first: torch.tensor_split order)."""
        return int(max(self.summary["microbatch_sizes"]))

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.summary["model"])

    @property
    def boundary_bytes(self) -> list[int]:
        """Bytes one microbatch sends across each stage boundary s|s+1."""
        return [int(s["output_bytes_per_microbatch"]) for s in self.summary["stage_costs"][:-1]]

    @property
    def one_clock(self) -> bool:
        """Whether the ranks' times are on one clock (summary.json's ``clocks``, schedules.timeline);
        else each rank's counts from its own step start."""
        return self.summary.get("clocks") == "host"

    def rank_start(self, step: int, rank: int) -> float:
        """When `rank` began measured step `step` on the run's clock (summary.json's
        ``rank_step_starts``, seconds from the step's earliest rank start); 0 where each rank
        counts from its own step start."""
        starts = self.summary.get("rank_step_starts") if self.one_clock else None
        return float(starts[step][rank]) if starts else 0.0

    @property
    def post_ahead(self) -> PostAhead:
        """When the executor posted each receive (runs from before the option: at its RECV)."""
        return PostAhead.parse(self.summary.get("post_ahead", 0))

    def with_steps(self, steps: Sequence[int]) -> "MeasuredRun":
        """This run with only the measured `steps`: their rows keep their step numbers (so
        cpu.csv's rows still join them) and ``step_times`` keeps theirs, in step order. For
        fits that leave steps out; not a run to check (`checked` wants steps 0..n-1)."""
        keep = sorted(set(int(s) for s in steps))
        summary = {**self.summary, "step_times": [self.step_times[s] for s in keep]}
        run = MeasuredRun(self.path, self.timeline[self.timeline["step"].isin(keep)],
                          self.memory[self.memory["step"].isin(keep)], summary)
        for name in ("program", "profile", "cpu"):  # read once, shared
            if name in self.__dict__:
                run.__dict__[name] = self.__dict__[name]
        return run

    def step_frames(self):
        """(step, that step's timeline rows) in step order."""
        return ((int(step), rows) for step, rows in self.timeline.groupby("step", sort=True))

    def step_metrics(self) -> pd.DataFrame:
        """Per measured step: makespan, bubble ratios, ... (schedules.timeline.step_metrics)."""
        return step_metrics(self.timeline, self.program.schedule.ranks)


def read_run(path) -> MeasuredRun:
    """Read a run directory's tables and summary; raises ScheduleError (one line) if anything is off."""
    root = Path(path)
    if not root.is_dir():
        raise ScheduleError(f"run directory {root} does not exist")
    missing = [name for name in REQUIRED if not (root / name).is_file()]
    if missing:
        raise ScheduleError(f"run directory {root} lacks {', '.join(missing)}")
    timeline = read_table(root / "timeline.csv", "timeline")
    check_timeline(timeline, str(root / "timeline.csv"))
    memory = read_table(root / "memory.csv", "memory")
    summary = read_json(root / "summary.json")
    if not isinstance(summary, dict):
        raise ScheduleError(f"{root / 'summary.json'} is not a JSON object")
    return MeasuredRun(root, timeline, memory, summary)


def read_measured(path) -> MeasuredRun:
    """Read and check a run directory (`read_run`, then `MeasuredRun.checked`)."""
    return read_run(path).checked()


def _check_summary(summary: dict, program: Program, where: Path) -> None:
    schedule = program.schedule
    required = ("schedule", "ranks", "microbatches", "chunks", "step_times", "stage_costs", "microbatch_sizes",
                "model", "peak_activation_bytes")
    missing = [k for k in required if k not in summary]
    if missing:
        raise ScheduleError(f"{where} lacks {', '.join(missing)} (not written by python -m runtime, or truncated)")
    for key, value in (("ranks", schedule.ranks), ("microbatches", schedule.microbatches), ("chunks", schedule.chunks)):
        if summary[key] != value:
            raise ScheduleError(f"{where} says {key}={summary[key]!r} but program.json has {value}")
    times = summary["step_times"]
    if not isinstance(times, list) or not times or not all(_finite(t) and t > 0 for t in times):
        raise ScheduleError(f"{where}: step_times must be a non-empty list of positive seconds")
    stages = summary["stage_costs"]
    if not isinstance(stages, list) or len(stages) != schedule.num_stages:
        raise ScheduleError(f"{where}: stage_costs must list the program's {schedule.num_stages} stages")
    for s, entry in enumerate(stages):
        layers = entry.get("layers") if isinstance(entry, dict) else None
        if not (isinstance(layers, list) and len(layers) == 2 and all(isinstance(x, int) for x in layers)
                and 0 <= layers[0] < layers[1]):
            raise ScheduleError(f"{where}: stage_costs[{s}] has no valid layer range [first, last + 1)")
        if s + 1 < len(stages) and not isinstance(entry.get("output_bytes_per_microbatch"), int):
            raise ScheduleError(f"{where}: stage_costs[{s}] lacks output_bytes_per_microbatch")
    sizes = summary["microbatch_sizes"]
    if not (isinstance(sizes, list) and len(sizes) == schedule.microbatches and all(isinstance(x, int) and x > 0 for x in sizes)):
        raise ScheduleError(f"{where}: microbatch_sizes must list {schedule.microbatches} positive sizes")
    peaks = summary["peak_activation_bytes"]
    if not (isinstance(peaks, list) and len(peaks) == schedule.ranks and all(isinstance(x, int) for x in peaks)):
        raise ScheduleError(f"{where}: peak_activation_bytes must list {schedule.ranks} byte counts, one per rank")
    if not isinstance(summary["model"], dict):
        raise ScheduleError(f"{where}: model must be an object of model flags")
    ahead = summary.get("post_ahead", 0)
    try:
        PostAhead.parse(ahead)
    except ScheduleError:
        raise ScheduleError(f"{where}: post_ahead must be a count of compute actions or 'step', got {ahead!r}") from None


def _check_timeline(timeline: pd.DataFrame, program: Program, steps: int, where: Path) -> None:
    if not np.isfinite(timeline[["start", "end"]].to_numpy()).all():
        raise ScheduleError(f"{where} has a start or end that is not a finite number")
    if (timeline["end"] < timeline["start"]).any():
        row = timeline[timeline["end"] < timeline["start"]].iloc[0]
        raise ScheduleError(f"{where}: {row['action']} of step {row['step']} ends before it starts")
    found = sorted(int(s) for s in timeline["step"].unique())
    if found != list(range(steps)):
        raise ScheduleError(
            f"{where} holds steps {_span(found)} but summary.json recorded {steps} (0..{steps - 1}): truncated?"
        )
    expected = [[str(a) for a in stream] for stream in program.streams]
    for (step, rank), rows in timeline.groupby(["step", "rank"], sort=True):
        if not 0 <= rank < len(expected):
            raise ScheduleError(f"{where}: step {step} has rows of rank {rank}, but the program has {len(expected)} ranks")
        got = list(rows["action"])
        if got != expected[rank]:
            if len(got) < len(expected[rank]) and got == expected[rank][: len(got)]:
                reason = f"has {len(got)} of its {len(expected[rank])} actions (truncated)"
            else:
                first = next((i for i, (a, b) in enumerate(zip(got, expected[rank])) if a != b), min(len(got), len(expected[rank])))
                reason = f"differs from program.json at action {first}"
            raise ScheduleError(f"{where}: rank {rank} in step {step} {reason}")
    per_step = timeline.groupby("step")["rank"].nunique()
    short = per_step[per_step != len(expected)]
    if len(short):
        raise ScheduleError(f"{where}: step {int(short.index[0])} has rows of {int(short.iloc[0])} of {len(expected)} ranks")


# A profile record's optional byte counts besides activation_bytes (runtime/profile.py).
BYTE_COUNTS = ("weight_bytes", "input_bytes", "input_weight_bytes", "output_bytes", "output_weight_bytes")


def read_profile(path: Path) -> dict[str, Any] | None:
    """profile.json checked for the fields calibration reads; None if there is none. Its
    records time F and B, and F_split (schedules.ir.SPLIT_FORWARD), I and W; a profile from
    before both ways were timed holds only the run's way, its split forward under "F": it is
    read under SPLIT_FORWARD, so that "F" always means a plain forward."""
    if not path.is_file():
        return None
    data = read_json(path)
    if not isinstance(data, dict) or not set(data) <= {"layers", "p2p", "allreduce"}:
        raise ScheduleError(f"{path} is not a profile (expected an object with 'layers', 'p2p' and/or 'allreduce')")
    layers = data.get("layers")
    if layers is not None:
        records = layers.get("records") if isinstance(layers, dict) else None
        if not isinstance(records, list) or not records:
            raise ScheduleError(f"{path}: layers.records must be a non-empty list")
        for i, r in enumerate(records):
            ok = (isinstance(r, dict) and r.get("role") in ROLES
                  and isinstance(r.get("layers"), int) and r["layers"] > 0 and isinstance(r.get("activation_bytes"), int)
                  and ("F" in r or SPLIT_FORWARD in r)
                  and all(_samples(r[k]) for k in (*COMPUTE_NAMES, SPLIT_FORWARD) if k in r)
                  and all(isinstance(r[k], int) and not isinstance(r[k], bool) and r[k] >= 0
                          for k in BYTE_COUNTS if k in r))
            if not ok:
                raise ScheduleError(f"{path}: layers.records[{i}] is malformed")
        if layers.get("split") and not any(SPLIT_FORWARD in r for r in records):
            layers["records"] = [{(SPLIT_FORWARD if k == "F" else k): v for k, v in r.items()} for r in records]
    p2p = data.get("p2p")
    if p2p is not None:
        one_way = p2p.get("one_way_seconds") if isinstance(p2p, dict) else None
        if not (isinstance(one_way, dict) and one_way and all(k.isdigit() and _samples(v) for k, v in one_way.items())):
            raise ScheduleError(f"{path}: p2p.one_way_seconds must map byte sizes to lists of seconds")
    allreduce = data.get("allreduce")
    if allreduce is not None:
        seconds = allreduce.get("seconds") if isinstance(allreduce, dict) else None
        if not (isinstance(seconds, dict) and len(seconds) > 1 and all(k.isdigit() and _samples(v) for k, v in seconds.items())):
            raise ScheduleError(f"{path}: allreduce.seconds must map two or more byte sizes to lists of seconds")
    return data


def _samples(value) -> bool:
    return isinstance(value, list) and bool(value) and all(_finite(x) and x >= 0 for x in value)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _span(values: list[int]) -> str:
    if not values:
        return "none"
    return f"{values[0]}..{values[-1]}" if values == list(range(values[0], values[-1] + 1)) else ", ".join(map(str, values))


def thread_cpu(timeline: pd.DataFrame, cpu: pd.DataFrame) -> pd.Series:
    """Each compute row of `timeline` that `cpu` (cpu.csv) holds, its thread CPU seconds, indexed
    as the timeline's rows (joined on step, rank and action)."""
    compute = timeline[timeline["kind"].isin(COMPUTE_NAMES)]
    keyed = (compute[["step", "rank", "action"]].reset_index()
             .merge(cpu, on=["step", "rank", "action"], how="inner", validate="one_to_one").set_index("index"))
    return keyed["thread_cpu"]
