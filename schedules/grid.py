"""A text grid (time step x rank) of a schedule, for terminals and error messages.

Every compute action takes one time step and starts as soon as its rank is free and
its inputs exist; communication is free. This is the classic picture of a pipeline
schedule, not a cost-model simulation.
"""

from __future__ import annotations

from .errors import ScheduleError
from .ir import Action, Kind
from .schedule import Schedule


def _dependencies(schedule: Schedule, action: Action) -> list[tuple[Action, ...]]:
    """Each entry is a set of alternatives, one of which must have run."""
    s, mb = action.stage, action.microbatch
    if action.kind is Kind.F:
        return [(Action(s - 1, Kind.F, mb),)] if s > 0 else []
    if action.kind is Kind.W:
        return [(Action(s, Kind.I, mb),)]
    deps: list[tuple[Action, ...]] = [(Action(s, Kind.F, mb),)]
    if s < schedule.num_stages - 1:
        deps.append((Action(s + 1, Kind.B, mb), Action(s + 1, Kind.I, mb)))
    return deps


def unit_steps(schedule: Schedule) -> list[list[int]]:
    """Per rank, the start step of each action in `schedule.order` under unit costs."""
    finished: dict[Action, int] = {}
    starts: list[list[int]] = [[] for _ in schedule.order]
    free = [0] * schedule.ranks
    progress = True
    while progress:
        progress = False
        for rank, row in enumerate(schedule.order):
            while len(starts[rank]) < len(row):
                action = row[len(starts[rank])]
                ready = free[rank]
                for alternatives in _dependencies(schedule, action):
                    done = [finished[a] for a in alternatives if a in finished]
                    if not done:
                        break
                    ready = max(ready, done[0])
                else:
                    starts[rank].append(ready)
                    finished[action] = free[rank] = ready + 1
                    progress = True
                    continue
                break
    if any(len(s) < len(row) for s, row in zip(starts, schedule.order)):
        raise ScheduleError("[deadlock] schedule: the grid cannot be drawn, some action never becomes ready")
    return starts


def grid(schedule: Schedule) -> str:
    """Render the schedule as a step x rank table of action texts ('.' = idle)."""
    starts = unit_steps(schedule)
    steps = max((s[-1] + 1 for s in starts if s), default=0)
    cells = [["."] * schedule.ranks for _ in range(steps)]
    for rank, row in enumerate(schedule.order):
        for action, step in zip(row, starts[rank]):
            cells[step][rank] = str(action)
    width = max([len(f"rank {schedule.ranks - 1}")] + [len(c) for line in cells for c in line])
    header = "step  " + " ".join(f"rank {r}".ljust(width) for r in range(schedule.ranks))
    lines = [schedule.describe(), header]
    for step, line in enumerate(cells):
        lines.append(f"{step:<5} " + " ".join(c.ljust(width) for c in line))
    return "\n".join(line.rstrip() for line in lines)
