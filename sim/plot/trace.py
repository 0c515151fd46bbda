"""Perfetto / Chrome trace export of one step of a timeline table (simulated or measured).

Format: the Chrome Trace Event JSON that ui.perfetto.dev and chrome://tracing open.
- every action is a complete event (``"ph": "X"``), ``ts``/``dur`` in microseconds,
  ``pid`` = rank, ``name`` = the action's text form (``4F3``), ``cat`` = its kind;
- each rank's threads hold compute, sends and receive waits apart; a category gets a
  second thread only where its own events overlap (measured sends may), so no thread
  ever holds two overlapping events;
- a flow arrow (``"ph": "s"`` then ``"f"`` with ``"bp": "e"``, one id per transfer) joins
  each SEND to its RECV: ``s`` at the send's start, ``f`` at the receive's end (the data's
  arrival); each is written right after its own slice: Perfetto binds a flow event to the
  slice open on its thread and orders equal timestamps by position in the file
  (trace_processor's TraceSorter), so the arrow lands on that slice;
- activation memory is a counter (``"ph": "C"``) per rank;
- ``"ph": "M"`` events name and order processes ("rank r") and threads.

Timestamps are whole nanoseconds written as microseconds plus a quarter nanosecond:
Perfetto truncates ``ts * 1000`` to integer nanoseconds, and without the nudge about 0.6%
of decimal values land one nanosecond low, which can make back-to-back slices overlap.
Durations are written unnudged, so a slice may end one nanosecond early, never late.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from schedules import Action
from schedules.ir import COMPUTE_NAMES, RECV_NAMES, SEND_NAMES, Transfer
from schedules.timeline import check_timeline

from ..metrics import one_step, select_step

# Thread id = category base + lane index; tid 0 is avoided (Perfetto reserves it for idle).
THREADS = (("compute", 1, COMPUTE_NAMES), ("send", 1001, SEND_NAMES), ("recv wait", 2001, RECV_NAMES))
MEMORY_COUNTER = "activation memory"
UNIT_ARG = "microbatch units"  # the counter's series without real bytes (see to_trace)


def _ns(seconds: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(seconds, dtype=float) * 1e9).astype(np.int64)


def _us(ns: int) -> float:
    """Microseconds for a whole-nanosecond time, nudged so truncating readers get it exactly."""
    return (int(ns) + 0.25) / 1000.0


def assign_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane of each interval so that no lane holds two overlapping ones (first-fit by start).

    Touching intervals (one ends where the next starts) share a lane.
    """
    order = np.lexsort((ends, starts))
    lane_end: list[int] = []
    lanes = np.zeros(len(starts), dtype=np.int64)
    for i in order:
        for lane, free_at in enumerate(lane_end):
            if free_at <= starts[i]:
                lane_end[lane] = ends[i]
                lanes[i] = lane
                break
        else:
            lane_end.append(ends[i])
            lanes[i] = len(lane_end) - 1
    return lanes


def _transfer_ids(frame: pd.DataFrame) -> dict[Transfer, int]:
    """Flow id of each transfer whose SEND and RECV are both in `frame` (ids 1, 2, ... in send order)."""
    received = {Action.parse(text).transfer for text in frame.loc[frame["kind"].isin(RECV_NAMES), "action"]}
    ids: dict[Transfer, int] = {}
    for text in frame.loc[frame["kind"].isin(SEND_NAMES), "action"]:
        transfer = Action.parse(text).transfer
        if transfer in received:
            ids[transfer] = len(ids) + 1
    return ids


def to_trace(
    timeline: pd.DataFrame,
    memory: pd.DataFrame | None = None,
    *,
    step: int | None = None,
    warmup: int = 0,
    name: str = "",
    unit_bytes: float | None = None,
) -> dict:
    """The trace of one step (`step`, else the median-makespan step after `warmup`) as a dict.

    Memory counters are in bytes, or with `unit_bytes` in units of that many bytes (a
    simulation without real activation sizes: one microbatch's activations of one rank's share)."""
    check_timeline(timeline)
    chosen = select_step(timeline, step, warmup)
    frame = one_step(timeline, chosen).reset_index(drop=True)
    ranks = int(frame["rank"].max()) + 1
    start_ns, end_ns = _ns(frame["start"]), _ns(frame["end"])
    flows = _transfer_ids(frame)

    columns = {c: frame[c].tolist() for c in ("rank", "stage", "chunk", "microbatch", "kind", "action", "peer")}
    events: list[dict] = []
    for rank in range(ranks):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        on_rank = frame["rank"].to_numpy() == rank
        for label, base, kinds in THREADS:
            idx = np.flatnonzero(on_rank & frame["kind"].isin(kinds).to_numpy())
            if idx.size == 0:
                continue
            lanes = assign_lanes(start_ns[idx], end_ns[idx])
            for lane in range(int(lanes.max()) + 1):
                tid = base + lane
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                               "args": {"name": label if lane == 0 else f"{label} {lane + 1}"}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                               "args": {"sort_index": tid}})
                members = idx[lanes == lane]
                members = members[np.lexsort((end_ns[members], start_ns[members]))]
                for i in members:
                    events.extend(_slice_events(columns, i, tid, start_ns[i], end_ns[i], flows))
    if memory is not None:
        events.extend(_counter_events(one_step(memory, chosen), unit_bytes))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schedule": name, "step": chosen, "source": str(frame["source"].iloc[0]), "ranks": ranks},
    }


def _slice_events(columns, i, tid, start, end, flows) -> list[dict]:
    """The X event of row `i` and the flow event that starts (SEND) or ends (RECV) on it, if any."""
    rank, text, kind = columns["rank"][i], columns["action"][i], columns["kind"][i]
    event = {
        "ph": "X", "name": text, "cat": kind, "pid": rank, "tid": tid,
        "ts": _us(start), "dur": (end - start) / 1000.0,  # unnudged: a truncating reader may end it 1 ns early, never late
        "args": {key: columns[key][i] for key in ("stage", "chunk", "microbatch", "peer")},
    }
    out = [event]
    flow_id = flows.get(Action.parse(text).transfer) if kind not in COMPUTE_NAMES else None
    if flow_id is not None and kind in SEND_NAMES:
        out.append({"ph": "s", "name": "transfer", "cat": "p2p", "id": flow_id, "pid": rank, "tid": tid,
                    "ts": _us(start)})
    elif flow_id is not None:
        out.append({"ph": "f", "bp": "e", "name": "transfer", "cat": "p2p", "id": flow_id, "pid": rank,
                    "tid": tid, "ts": _us(end)})
    return out


def _counter_events(step_memory: pd.DataFrame, unit_bytes: float | None = None) -> list[dict]:
    rows = step_memory.sort_values(["rank", "time"], kind="stable")
    times = _ns(rows["time"])

    def value(held) -> dict:
        return {"bytes": int(held)} if unit_bytes is None else {UNIT_ARG: round(float(held) / unit_bytes, 6)}

    return [
        {"ph": "C", "name": MEMORY_COUNTER, "pid": int(rank), "tid": THREADS[0][1], "ts": _us(t), "args": value(held)}
        for rank, t, held in zip(rows["rank"], times, rows["bytes"])
    ]


def write_trace(path, timeline: pd.DataFrame, memory: pd.DataFrame | None = None, **options) -> dict:
    """Write `to_trace(timeline, memory, **options)` as JSON to `path`; returns the trace."""
    trace = to_trace(timeline, memory, **options)
    Path(path).write_text(json.dumps(trace, separators=(",", ":")))
    return trace
