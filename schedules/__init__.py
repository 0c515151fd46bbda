"""bubblescope.schedules: pipeline schedules defined once as instruction streams.

Pure Python (no torch, no simpy). Build a schedule by name, lower it to per-rank
streams with point-to-point actions, validate, and read or write it as CSV or JSON.
"""

from .analysis import in_flight, peak_in_flight
from .checked import build, build_for, load_csv, load_json, load_program_csv, load_program_json, lower, validate
from .errors import ScheduleError
from .grid import grid
from .io import save_csv, save_json
from .ir import Action, Kind
from .registry import available, generator, register
from .schedule import Program, Schedule

# Generator modules register themselves on import; one module per schedule.
from . import gpipe, one_f_one_b, interleaved, zb_h1, zb_h2, zbv, looped_bfs, dualpipev, zb_auto  # noqa: E402,F401  isort: skip

__all__ = [
    "Action",
    "Kind",
    "Program",
    "Schedule",
    "ScheduleError",
    "available",
    "build",
    "build_for",
    "generator",
    "grid",
    "in_flight",
    "load_csv",
    "load_json",
    "load_program_csv",
    "load_program_json",
    "lower",
    "peak_in_flight",
    "register",
    "save_csv",
    "save_json",
    "validate",
]
