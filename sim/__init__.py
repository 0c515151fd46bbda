"""bubblescope.sim: a SimPy discrete-event engine that replays lowered schedules.

`simulate(schedule_or_program, costs)` replays the per-rank streams of a schedule under
a `CostModel` and returns a `SimResult` (timeline and memory tables, bubble ratios,
peak activation memory). `python -m sim` is the command line (compare, sweep, ...).

Three wings, each importing only those below it: the model (the plain modules of sim/:
costs, engine, result, metrics, measured runs, calibration, cost sources, comparison,
sweep), sim/plot/ (figures and traces) and sim/cli/ (one module per subcommand).
"""

from .costs import CostError, CostModel
from .engine import simulate
from .result import SimResult

__all__ = ["CostError", "CostModel", "SimResult", "simulate"]
