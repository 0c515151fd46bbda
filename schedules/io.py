"""Reading and writing schedules and programs as CSV (the field's layout) and JSON.

CSV layout, as written by torch.distributed.pipelining's ``_dump_csv``: one row per
rank, one action per cell in its text form (``0F1``, ``2SEND_B3``); empty cells are
idle slots and are skipped, as are torch's FSDP housekeeping cells (``0UNSHARD``). The
compute-only form holds F/B/I/W; the with-communication form holds the lowered streams.
Sizes and placement are inferred from the file.

This module reads and writes the formats and checks nothing beyond them; the loaders
that hand out checked schedules and programs (`load_csv`, `load_json`, ...) are in
schedules.checked.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from .errors import ScheduleError
from .ir import Action
from .schedule import Program, Schedule

JSON_FORMAT = "bubblescope-schedule"

# torch.distributed.pipelining writes per-stage FSDP housekeeping into its comms CSVs
# (e.g. ``0UNSHARD``, ``1RESHARD``, ``0REDUCE_GRAD``); they carry no pipeline data and
# are skipped on load.
_HOUSEKEEPING = re.compile(r"\d+(UNSHARD|RESHARD|REDUCE_GRAD)\d*")
JSON_VERSION = 1


def save_csv(obj: Schedule | Program, path: str | Path) -> None:
    """Write a Schedule (compute-only form) or a Program (with communication)."""
    rows = obj.streams if isinstance(obj, Program) else obj.order
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        for row in rows:
            writer.writerow([str(a) for a in row])


def read_csv_rows(path: str | Path) -> list[list[Action]]:
    """Per rank (row of the file), its actions in order; ScheduleError naming a bad cell."""
    try:
        with open(path, newline="") as handle:
            raw = list(csv.reader(handle))
    except OSError as exc:
        raise ScheduleError(f"cannot read schedule file {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ScheduleError(f"{path} is not a CSV schedule: {exc}") from None
    # Trailing blank lines are not ranks.
    while raw and not any(cell.strip() for cell in raw[-1]):
        raw.pop()
    if not raw:
        raise ScheduleError(f"{path} holds no schedule rows")
    rows = []
    for r, cells in enumerate(raw):
        row = []
        for c, cell in enumerate(cells):
            if not cell.strip() or _HOUSEKEEPING.fullmatch(cell.strip()):
                continue
            try:
                row.append(Action.parse(cell))
            except ScheduleError as exc:
                raise ScheduleError(f"{path} row {r + 1}, cell {c + 1}: {exc}") from None
        rows.append(row)
    return rows


def infer_schedule(rows: list[list[Action]], name: str, where: str) -> Schedule:
    """Sizes and placement from the compute actions of per-rank rows."""
    ranks = len(rows)
    stage_rank: dict[int, int] = {}
    max_mb = -1
    for rank, row in enumerate(rows):
        for action in row:
            max_mb = max(max_mb, action.microbatch)
            if not action.kind.is_compute:
                continue
            holder = stage_rank.setdefault(action.stage, rank)
            if holder != rank:
                raise ScheduleError(
                    f"[placement] {where}: stage {action.stage} has compute actions on ranks {holder} and {rank} ({action})"
                )
    if not stage_rank:
        raise ScheduleError(f"{where} holds no compute actions")
    num_stages = max(stage_rank) + 1
    missing = [s for s in range(num_stages) if s not in stage_rank]
    if missing:
        raise ScheduleError(f"[placement] {where}: stages {missing} have no actions, so their rank is unknown")
    if num_stages % ranks:
        raise ScheduleError(f"[placement] {where}: {num_stages} stages cannot be spread evenly over {ranks} ranks")
    order = tuple(tuple(a for a in row if a.kind.is_compute) for row in rows)
    return Schedule(
        name=name,
        ranks=ranks,
        microbatches=max_mb + 1,
        chunks=num_stages // ranks,
        stage_to_rank=tuple(stage_rank[s] for s in range(num_stages)),
        order=order,
    )


def to_dict(obj: Schedule | Program) -> dict:
    """A JSON-ready dict; a Program adds its streams to the schedule's fields."""
    schedule = obj.schedule if isinstance(obj, Program) else obj
    data = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "name": schedule.name,
        "ranks": schedule.ranks,
        "microbatches": schedule.microbatches,
        "chunks": schedule.chunks,
        "stage_to_rank": list(schedule.stage_to_rank),
        "order": [[str(a) for a in row] for row in schedule.order],
    }
    if isinstance(obj, Program):
        data["streams"] = [[str(a) for a in row] for row in obj.streams]
    return data


def from_dict(data: dict, where: str = "schedule JSON") -> Schedule | Program:
    """Inverse of to_dict, unchecked; raises ScheduleError naming a bad field."""
    if not isinstance(data, dict) or data.get("format") != JSON_FORMAT:
        raise ScheduleError(f"{where}: not a {JSON_FORMAT} document (missing or wrong 'format')")

    def field(key: str, kind: type):
        value = data.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ScheduleError(f"{where}: field {key!r} must be {kind.__name__}, got {value!r}")
        return value

    def actions(key: str) -> tuple[tuple[Action, ...], ...]:
        rows = field(key, list)
        parsed = []
        for r, row in enumerate(rows):
            if not isinstance(row, list):
                raise ScheduleError(f"{where}: {key}[{r}] must be a list of action strings")
            try:
                parsed.append(tuple(Action.parse(str(cell)) for cell in row))
            except ScheduleError as exc:
                raise ScheduleError(f"{where}: {key}[{r}]: {exc}") from None
        return tuple(parsed)

    s2r = field("stage_to_rank", list)
    if not all(isinstance(x, int) for x in s2r):
        raise ScheduleError(f"{where}: stage_to_rank must list integers")
    schedule = Schedule(
        name=field("name", str),
        ranks=field("ranks", int),
        microbatches=field("microbatches", int),
        chunks=field("chunks", int),
        stage_to_rank=tuple(s2r),
        order=actions("order"),
    )
    return Program(schedule, actions("streams")) if "streams" in data else schedule


def save_json(obj: Schedule | Program, path: str | Path) -> None:
    """Write a Schedule or a Program as JSON (see to_dict)."""
    Path(path).write_text(json.dumps(to_dict(obj), indent=1) + "\n")


def read_json(path: str | Path, error: type[Exception] = ScheduleError, what: str = "") -> Any:
    """The JSON document in file `path`; an unreadable file or bad JSON raises `error` with one
    line: "cannot read {what}{path}: ..." or "{what}{path} is not valid JSON: ..."."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise error(f"cannot read {what}{path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{what}{path} is not valid JSON: {exc}") from None
