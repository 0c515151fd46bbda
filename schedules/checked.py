"""Checked schedules: build -> lower -> validate composed, each schedule checked once.

Generating (`registry`), lowering (`lowering`) and the rules (`validate`) know nothing of
each other's order; this module composes them. Checking a schedule means checking its
rules, lowering it and checking the program (transfers pair up, nothing deadlocks), so
the check yields the lowered program: it is kept with the schedule (as functools'
cached_property keeps a value, in the instance's __dict__; a pure function of the frozen
fields, never copied by dataclasses.replace), and `lower` hands it out again. A schedule
from `build` or a file loader is thereby checked once however often it is lowered or
simulated; any other schedule is checked on its first `lower`.
"""

from __future__ import annotations

from .errors import ScheduleError
from .registry import generator
from .schedule import Program, Schedule
from .validate import check_schedule

_PROGRAM = "_checked_program"  # where a checked schedule keeps its program


def lower(schedule: Schedule) -> Program:
    """The checked, lowered Program of `schedule`; raises ScheduleError naming the broken rule."""
    kept = vars(schedule).get(_PROGRAM)
    if kept is None:
        kept = check_schedule(schedule)
        vars(schedule)[_PROGRAM] = kept
    return kept


def build(name: str, ranks: int, microbatches: int, chunks: int | None = None, **options) -> Schedule:
    """Generate and check the schedule `name`; raises ScheduleError on illegal sizes."""
    gen = generator(name)
    for label, value in (("ranks", ranks), ("microbatches", microbatches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ScheduleError(f"{label} must be a positive integer; got {value!r}")
    if chunks is not None and (not isinstance(chunks, int) or chunks < 1):
        raise ScheduleError(f"chunks must be a positive integer; got {chunks!r}")
    schedule = gen.make(ranks, microbatches, gen.resolve_chunks(chunks), **options)
    lower(schedule)
    return schedule


def build_for(name: str, ranks: int, microbatches: int, chunks: int | None) -> Schedule:
    """Build `name`, passing `chunks` only if the schedule takes a chunk count (others run their own)."""
    return build(name, ranks=ranks, microbatches=microbatches, chunks=chunks if generator(name).takes_chunks else None)
