"""What schedules/ hands out, checked once: built, loaded and lowered schedules and programs.

Generating (`registry`), reading files (`io`), lowering (`lowering`) and the rules
(`validate`) know nothing of each other; this module composes them. Checking a
schedule means checking its rules, lowering it and checking that the program cannot
deadlock (check_schedule says why that suffices), so the check yields the lowered program: it is kept with
the schedule (as functools' cached_property keeps a value, in the instance's __dict__;
a pure function of the frozen fields, never copied by dataclasses.replace), and `lower`
hands it out again. A schedule from `build` or a loader is thereby checked once however
often it is lowered or simulated; any other schedule is checked on its first `lower`.
"""

from __future__ import annotations

from pathlib import Path

from .errors import ScheduleError
from .io import from_dict, infer_schedule, read_csv_rows, read_json
from .lowering import insert_comms, insert_grad_reductions
from .registry import generator
from .schedule import Program, Schedule
from .validate import check_program, check_rules, find_deadlock

_PROGRAM = "_checked_program"  # where a checked schedule keeps its program


def check_schedule(schedule: Schedule) -> Program:
    """Check the schedule's rules, lower it and check the program; returns that program.

    Of the program's checks only the deadlock one can fail on a lowered schedule that keeps
    the rules: lowering puts one RECV before each consumer and one SEND after each producer of
    a transfer between ranks, so the streams follow the schedule's order, every transfer is
    sent and received once, and in the right places (check_program, the full check a loaded
    program gets, accepts them: tests/test_schedules_speedup.py). The deadlock check runs on
    the compute order (find_deadlock); check_program, run only when it finds one, names it.
    """
    check_rules(schedule)
    program = insert_comms(schedule)
    if find_deadlock(schedule):
        check_program(program)
        raise AssertionError(f"check_program found no deadlock in {schedule.describe()}, find_deadlock did")
    return program


def lower(schedule: Schedule, data_parallel: int = 1) -> Program:
    """The checked, lowered Program of `schedule`; raises ScheduleError naming the broken rule.

    With `data_parallel` > 1 replicas the program also reduces each stage's gradients
    (REDUCE_GRAD after its last backward, `lowering.insert_grad_reductions`)."""
    kept = vars(schedule).get(_PROGRAM)
    if kept is None:
        kept = check_schedule(schedule)
        vars(schedule)[_PROGRAM] = kept
    if data_parallel > 1:
        reduced = insert_grad_reductions(kept)
        check_program(reduced)
        return reduced
    return kept


def validate(obj: Schedule | Program) -> None:
    """Check every rule for a Schedule or a Program; raises ScheduleError."""
    if isinstance(obj, Program):
        check_rules(obj.schedule)
        check_program(obj)
    elif isinstance(obj, Schedule):
        lower(obj)
    else:
        raise TypeError(f"validate() takes a Schedule or a Program, not {type(obj).__name__}")


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


def load_csv(path: str | Path, name: str | None = None) -> Schedule:
    """Load and check a schedule from CSV; communication actions, if any, are dropped."""
    schedule = infer_schedule(read_csv_rows(path), name or Path(path).stem, str(path))
    lower(schedule)
    return schedule


def load_program_csv(path: str | Path, name: str | None = None) -> Program:
    """Load and check a lowered program (with SEND/RECV actions as written) from CSV."""
    rows = read_csv_rows(path)
    program = Program(infer_schedule(rows, name or Path(path).stem, str(path)), tuple(tuple(row) for row in rows))
    validate(program)
    return program


def load_json(path: str | Path) -> Schedule | Program:
    """Read and check what save_json wrote: a Program if the file has streams, else a Schedule."""
    obj = from_dict(read_json(path), where=str(path))
    validate(obj)
    return obj


def load_program_json(path: str | Path) -> Program:
    """Read a Program from JSON; a file holding only a Schedule is lowered."""
    obj = load_json(path)
    return obj if isinstance(obj, Program) else lower(obj)
