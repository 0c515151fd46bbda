"""The one timeline table schema, shared by the simulator and the executor.

A timeline is a pandas DataFrame with one row per executed action:

==========  =======  ==========================================================
column      dtype    meaning
==========  =======  ==========================================================
step        int64    training step (0 for a simulation; 0..n-1 for a measured run)
rank        int64    pipeline rank that ran the action
stage       int64    pipeline stage of the action (for SEND/RECV: as in the action text)
chunk       int64    index of that stage among its rank's stages (0..v-1)
microbatch  int64    microbatch index (-1 for REDUCE_GRAD, which has none)
kind        str      F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B or REDUCE_GRAD
action      str      the action's text form, e.g. ``4F3`` or ``2SEND_B3``
start       float64  seconds from the step's start (measured: see ``clocks`` below)
end         float64  seconds from the step's start
peer        int64    the other rank of a SEND/RECV; -1 for compute actions
source      str      "sim" or "measured"
==========  =======  ==========================================================

For a SEND, [start, end] is the transfer on the wire (simulated) or the time from
posting the send to its completion (measured). For a RECV it is the time the rank
waited for the data (from reaching the RECV until the data was there). For a REDUCE_GRAD
(data parallelism) it is the stage's gradient all-reduce, from its launch to its end.

Measured times are on one clock where the run's summary.json says ``clocks: "host"`` (CPU ranks
of one host: from the earliest rank's step start, runtime.clock); with ``clocks: "rank"`` (GPU,
several hosts, runs recorded before the field) each rank counts from its own step start, the
ranks aligned at the step's barrier only.

A memory table has one row per change of activation memory on a rank:
step (int64), rank (int64), time (float64 seconds), bytes (int64, activation bytes
held after the change), source (str).

A measured run also has a CPU table (cpu.csv), one row per compute action of each step:
step (int64), rank (int64), action (str, its text as in the timeline) and thread_cpu
(float64 seconds of CPU its rank's thread used over the row). A row's wall time less its
CPU time is what it waited for a core where ranks share cores; the simulator has no such
table.

This module names the columns, converts rows and CSV files into typed frames and
defines the metrics of a step that both the simulator and the executor report
(makespan, bubble ratios); pandas is imported lazily so that `schedules` itself stays
light.
"""

from __future__ import annotations

from .errors import ScheduleError
from .ir import COMPUTE_NAMES

TIMELINE_COLUMNS: tuple[str, ...] = (
    "step", "rank", "stage", "chunk", "microbatch", "kind", "action", "start", "end", "peer", "source",
)
TIMELINE_DTYPES: dict[str, str] = {
    "step": "int64", "rank": "int64", "stage": "int64", "chunk": "int64", "microbatch": "int64",
    "kind": "str", "action": "str", "start": "float64", "end": "float64", "peer": "int64", "source": "str",
}
MEMORY_COLUMNS: tuple[str, ...] = ("step", "rank", "time", "bytes", "source")
MEMORY_DTYPES: dict[str, str] = {
    "step": "int64", "rank": "int64", "time": "float64", "bytes": "int64", "source": "str",
}
CPU_COLUMNS: tuple[str, ...] = ("step", "rank", "action", "thread_cpu")
SOURCES = ("sim", "measured")


def missing_columns(columns, expected: tuple[str, ...]) -> list[str]:
    """Columns of `expected` absent from `columns` (for clear errors on malformed tables)."""
    present = set(columns)
    return [c for c in expected if c not in present]


def check_timeline(timeline, what: str = "timeline") -> None:
    """Raise ScheduleError unless `timeline` has this schema's columns and at least one row."""
    missing = missing_columns(timeline.columns, TIMELINE_COLUMNS)
    if missing:
        raise ScheduleError(f"{what} is not a timeline table: missing columns {', '.join(missing)}")
    if len(timeline) == 0:
        raise ScheduleError(f"{what} has no rows")


def _frame(rows, columns: tuple[str, ...], dtypes: dict[str, str]):
    import pandas as pd

    frame = pd.DataFrame.from_records(list(rows), columns=list(columns))
    return frame.astype(dtypes)


def timeline_frame(rows):
    """A typed timeline DataFrame from tuples in TIMELINE_COLUMNS order (or dicts)."""
    return _frame(rows, TIMELINE_COLUMNS, TIMELINE_DTYPES)


def memory_frame(rows):
    """A typed memory DataFrame from tuples in MEMORY_COLUMNS order (or dicts)."""
    return _frame(rows, MEMORY_COLUMNS, MEMORY_DTYPES)


def read_table(path, kind: str = "timeline"):
    """Read a timeline or memory CSV, checking its columns; raises ScheduleError if malformed."""
    import pandas as pd

    columns, dtypes = (
        (TIMELINE_COLUMNS, TIMELINE_DTYPES) if kind == "timeline" else (MEMORY_COLUMNS, MEMORY_DTYPES)
    )
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise ScheduleError(f"cannot read {kind} table {path}: {exc}") from None
    missing = missing_columns(frame.columns, columns)
    if missing:
        raise ScheduleError(f"{path} is not a {kind} table: missing columns {', '.join(missing)}")
    try:
        return frame[list(columns)].astype(dtypes)
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{path}: a {kind} column has a malformed value ({exc})") from None


def bubble_ratio(ranks: int, makespan: float, busy: float) -> float:
    """Idle compute time over the ranks x makespan box (GPipe / zero-bubble definition).

    `busy` is the compute time summed over ranks; 0 when the makespan is 0. The simulator
    and the executor both report this, so it is defined here once.
    """
    box = ranks * makespan
    return (box - busy) / box if box > 0 else 0.0


def bubble_ratio_rank_span(spans, busy) -> float:
    """The zero-bubble paper's bubble rate: (cost - ideal) / cost (Qi et al., ICLR 2024, Sec. 5.3).

    `spans` and `busy` hold one value per rank: the time from the rank's first compute start
    to its last compute end, and its summed compute time. cost is the longest span (the
    paper's "largest execution time of all stages"); ideal is the busiest rank's compute time
    (the paper's m(T_F + T_B + T_W), which every rank has when stages are uniform). 0 when
    every span is 0.
    """
    cost = max(spans, default=0.0)
    return (cost - max(busy, default=0.0)) / cost if cost > 0 else 0.0


def rank_span_bubbles(spans, busy) -> list[float]:
    """Per rank, idle time inside its own span over that span (0 for an empty span)."""
    return [(s - b) / s if s > 0 else 0.0 for s, b in zip(spans, busy)]


def step_makespans(timeline):
    """Makespan of every step of a timeline, indexed by step in order: the latest end of any
    action (every rank starts the step at 0)."""
    return timeline.groupby("step")["end"].max().sort_index()


def step_metrics(timeline, ranks: int | None = None):
    """One row per step of a timeline (simulated or measured), in step order: step, makespan
    (`step_makespans`), busy (compute seconds summed over ranks), span (the longest rank span:
    a rank's first compute start to its last compute end), bubble_ratio and
    bubble_ratio_rank_span (as defined above). `ranks` defaults to the highest rank in the
    table plus one."""
    import pandas as pd

    p = int(timeline["rank"].max()) + 1 if ranks is None else ranks
    makespan = step_makespans(timeline)
    compute = timeline[timeline["kind"].isin(COMPUTE_NAMES)]
    per_rank = compute.assign(duration=compute["end"] - compute["start"]).groupby(["step", "rank"]).agg(
        first=("start", "min"), last=("end", "max"), busy=("duration", "sum"))
    per_rank["span"] = per_rank["last"] - per_rank["first"]
    rows = []
    for step, t in zip(makespan.index, makespan.to_numpy(dtype=float)):
        ranks_of_step = per_rank.loc[step] if step in per_rank.index.get_level_values("step") else None
        spans = [] if ranks_of_step is None else ranks_of_step["span"].tolist()
        busy = [] if ranks_of_step is None else ranks_of_step["busy"].tolist()
        rows.append({
            "step": int(step), "makespan": t, "busy": float(sum(busy)), "span": max(spans, default=0.0),
            "bubble_ratio": bubble_ratio(p, t, float(sum(busy))),
            "bubble_ratio_rank_span": bubble_ratio_rank_span(spans, busy),
        })
    return pd.DataFrame(rows, columns=["step", "makespan", "busy", "span", "bubble_ratio", "bubble_ratio_rank_span"])
