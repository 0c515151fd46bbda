"""A measured run directory (runtime's output) read for plotting.

Layout (written by the executor): ``timeline.csv`` and ``memory.csv`` in the
`schedules.timeline` schema with a step column, ``summary.json`` (schedule, ranks,
microbatches, chunks, ...) and ``program.json`` (the lowered program that was run).
Every problem is a ScheduleError with a one-line message naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from schedules import Program, ScheduleError
from schedules.timeline import read_table

from .plot_data import check_timeline

REQUIRED = ("timeline.csv", "memory.csv", "summary.json")


@dataclass(frozen=True)
class MeasuredRun:
    """The tables and summary of one run directory."""

    path: Path
    timeline: pd.DataFrame = field(repr=False)
    memory: pd.DataFrame = field(repr=False)
    summary: dict = field(repr=False)

    @property
    def name(self) -> str:
        """The schedule's name from summary.json, else the directory name."""
        return str(self.summary.get("schedule") or self.path.name)


def read_run(path) -> MeasuredRun:
    """Read and check a run directory; raises ScheduleError (one line) if anything is off."""
    root = Path(path)
    if not root.is_dir():
        raise ScheduleError(f"run directory {root} does not exist")
    missing = [name for name in REQUIRED if not (root / name).is_file()]
    if missing:
        raise ScheduleError(f"run directory {root} lacks {', '.join(missing)}")
    timeline = read_table(root / "timeline.csv", "timeline")
    check_timeline(timeline, str(root / "timeline.csv"))
    memory = read_table(root / "memory.csv", "memory")
    try:
        summary = json.loads((root / "summary.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScheduleError(f"{root / 'summary.json'} is not valid JSON: {exc}") from None
    if not isinstance(summary, dict):
        raise ScheduleError(f"{root / 'summary.json'} is not a JSON object")
    return MeasuredRun(root, timeline, memory, summary)


def run_program(run: MeasuredRun) -> Program:
    """The program the run executed, from its program.json."""
    from schedules.io import load_program_json

    path = run.path / "program.json"
    if not path.is_file():
        raise ScheduleError(f"run directory {run.path} lacks program.json (needed to simulate the run)")
    return load_program_json(path)
