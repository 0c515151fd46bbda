"""Perfetto / Chrome trace export: the structure a trace viewer relies on, checked event by event.

Times are read back the way Perfetto's JSON importer reads them: int(us * 1000) nanoseconds.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedules
from plot_tables import gpipe_memory, gpipe_timeline, measured_steps
from schedules import Action
from schedules.timeline import timeline_frame
from sim import CostModel, simulate
from sim.plot.trace import assign_lanes, to_trace, write_trace

CATEGORY = {"F": "compute", "B": "compute", "I": "compute", "W": "compute",
            "SEND_F": "send", "SEND_B": "send", "RECV_F": "recv", "RECV_B": "recv"}


def ns(us: float) -> int:
    """What Perfetto's JSON importer makes of a microsecond value."""
    return int(us * 1000.0)


def by_phase(trace: dict) -> dict[str, list[dict]]:
    out = defaultdict(list)
    for event in trace["traceEvents"]:
        out[event["ph"]].append(event)
    return out


def check_structure(trace: dict, table) -> None:
    """Every invariant the export promises, against the table it came from."""
    events = trace["traceEvents"]
    phases = by_phase(trace)
    assert set(phases) <= {"M", "X", "s", "f", "C"}
    assert json.loads(json.dumps(trace)) == trace  # plain JSON

    # One X event per row: name = action text, pid = rank, exact nanosecond times.
    slices = phases["X"]
    assert len(slices) == len(table)
    rows = {r.action: r for r in table.itertuples()}
    assert len(rows) == len(table)  # action texts are unique within a step
    for event in slices:
        row = rows[event["name"]]
        assert event["pid"] == row.rank and event["cat"] == row.kind
        assert ns(event["ts"]) == round(row.start * 1e9)
        end = ns(event["ts"]) + ns(event["dur"])
        assert round(row.end * 1e9) - 1 <= end <= round(row.end * 1e9)  # may end 1 ns early, never late
        assert event["args"]["microbatch"] == row.microbatch and event["args"]["stage"] == row.stage

    # Named processes and threads; one kind of work per thread; no overlap on a thread.
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in phases["M"] if e["name"].endswith("_name")}
    threads = defaultdict(list)
    for event in slices:
        threads[(event["pid"], event["tid"])].append(event)
    for (pid, tid), members in threads.items():
        assert names[(pid, None)] == f"rank {pid}"
        assert (pid, tid) in names and tid != 0
        categories = {CATEGORY[e["cat"]] for e in members}
        assert len(categories) == 1
        assert names[(pid, tid)].split()[0] == {"compute": "compute", "send": "send", "recv": "recv"}[categories.pop()]
        members.sort(key=lambda e: (ns(e["ts"]), ns(e["dur"])))
        for before, after in zip(members, members[1:]):
            assert ns(before["ts"]) + ns(before["dur"]) <= ns(after["ts"]), (before["name"], after["name"])

    # Flows: an 's' right after each SEND slice, its 'f' right after the matching RECV slice.
    position = {id(e): i for i, e in enumerate(events)}
    slice_at = {e["name"]: e for e in slices}
    starts = {e["id"]: e for e in phases["s"]}
    finishes = {e["id"]: e for e in phases["f"]}
    assert len(starts) == len(phases["s"]) and len(finishes) == len(phases["f"])
    assert set(starts) == set(finishes)
    sends = [e for e in slices if e["cat"].startswith("SEND")]
    assert len(starts) == len(sends)
    for flow_id, start in starts.items():
        send = events[position[id(start)] - 1]
        assert send["ph"] == "X" and send["cat"].startswith("SEND")
        assert (start["pid"], start["tid"], start["ts"]) == (send["pid"], send["tid"], send["ts"])
        recv = slice_at[str(Action.parse(send["name"]).matching())]
        finish = finishes[flow_id]
        assert events[position[id(finish)] - 1] is recv
        assert finish["bp"] == "e" and (finish["pid"], finish["tid"]) == (recv["pid"], recv["tid"])
        assert finish["cat"] == start["cat"] and finish["name"] == start["name"]
        assert ns(finish["ts"]) == ns(recv["ts"]) + ns(recv["dur"]) or ns(finish["ts"]) == ns(recv["ts"]) + ns(
            recv["dur"]) + 1


def test_gpipe_trace_structure_and_memory_counters():
    p, m = 3, 4
    table = gpipe_timeline(p, m, 0.001, 0.0023)
    memory = gpipe_memory(p, m, 0.001, 0.0023, unit=123)
    trace = to_trace(table, memory, name="gpipe")
    check_structure(trace, table)
    counters = by_phase(trace)["C"]
    assert len(counters) == len(memory)
    for rank in range(p):
        mine = [e for e in counters if e["pid"] == rank]
        expected = memory[memory["rank"] == rank]
        assert [e["args"]["bytes"] for e in mine] == list(expected["bytes"])
        assert [ns(e["ts"]) for e in mine] == [round(t * 1e9) for t in expected["time"]]
        assert max(e["args"]["bytes"] for e in mine) == m * 123
    assert trace["otherData"] == {"schedule": "gpipe", "step": 0, "source": "sim", "ranks": p}
    assert trace["displayTimeUnit"] == "ms"


def test_overlapping_sends_get_a_second_thread():
    rows = [
        (0, 0, 0, 0, 0, "F", "0F0", 0.0, 1.0, -1, "measured"),
        (0, 0, 0, 0, 0, "SEND_F", "0SEND_F0", 1.0, 3.0, 1, "measured"),
        (0, 0, 0, 0, 1, "F", "0F1", 1.0, 2.0, -1, "measured"),
        (0, 0, 0, 0, 1, "SEND_F", "0SEND_F1", 2.0, 4.0, 1, "measured"),  # posted before the first completes
        (0, 1, 1, 0, 0, "RECV_F", "1RECV_F0", 0.0, 3.0, 0, "measured"),
        (0, 1, 1, 0, 0, "F", "1F0", 3.0, 4.0, -1, "measured"),
        (0, 1, 1, 0, 1, "RECV_F", "1RECV_F1", 4.0, 4.0, 0, "measured"),
        (0, 1, 1, 0, 1, "F", "1F1", 4.0, 5.0, -1, "measured"),
    ]
    table = timeline_frame(rows)
    trace = to_trace(table)
    check_structure(trace, table)
    send_threads = {e["tid"] for e in by_phase(trace)["X"] if e["cat"] == "SEND_F"}
    assert len(send_threads) == 2
    names = {e["args"]["name"] for e in by_phase(trace)["M"] if e["name"] == "thread_name" and e["pid"] == 0}
    assert names == {"compute", "send", "send 2"}


def test_flow_to_a_receive_that_started_waiting_first():
    """The RECV slice begins before the SEND (the rank waits): the arrow still ends at the arrival."""
    rows = [
        (0, 0, 0, 0, 0, "F", "0F0", 0.0, 2.0, -1, "sim"),
        (0, 0, 0, 0, 0, "SEND_F", "0SEND_F0", 2.0, 2.5, 1, "sim"),
        (0, 1, 1, 0, 0, "RECV_F", "1RECV_F0", 0.0, 2.5, 0, "sim"),
        (0, 1, 1, 0, 0, "F", "1F0", 2.5, 4.5, -1, "sim"),
    ]
    trace = to_trace(timeline_frame(rows))
    check_structure(trace, timeline_frame(rows))
    [start], [finish] = by_phase(trace)["s"], by_phase(trace)["f"]
    assert ns(start["ts"]) == 2_000_000_000 and ns(finish["ts"]) == 2_500_000_000


def test_measured_table_exports_the_median_step():
    table = measured_steps(2, 3, [9.0, 1.0, 2.0])
    trace = to_trace(table)
    assert trace["otherData"]["step"] == 2 and trace["otherData"]["source"] == "measured"
    check_structure(trace, table[table["step"] == 2])
    assert to_trace(table, step=0)["otherData"]["step"] == 0
    assert to_trace(table, warmup=1)["otherData"]["step"] == 1


def test_write_trace_round_trips(tmp_path):
    table = gpipe_timeline(2, 2)
    written = write_trace(tmp_path / "t.json", table, gpipe_memory(2, 2))
    assert json.loads((tmp_path / "t.json").read_text()) == written


@pytest.mark.parametrize("name", schedules.available())
def test_every_schedule_with_transfer_time(name):
    gen = schedules.generator(name)
    schedule = schedules.build(name, ranks=4, microbatches=8, chunks=2 if gen.chunks is None else None)
    costs = CostModel(forward=0.003, backward_input=0.002, backward_weight=0.0017, p2p_latency=0.0004,
                      p2p_bandwidth=1e9, p2p_activation_bytes=300_000)
    result = simulate(schedule, costs)
    trace = to_trace(result.timeline, result.memory, name=name)
    check_structure(trace, result.timeline)
    kinds = Counter(e["cat"] for e in by_phase(trace)["X"])
    assert kinds["SEND_F"] == kinds["RECV_F"] > 0


def test_assign_lanes_small_case():
    starts = np.array([0, 1, 3, 5, 4])
    ends = np.array([5, 3, 4, 6, 4])
    assert list(assign_lanes(starts, ends)) == [0, 1, 1, 0, 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10)), min_size=1, max_size=40))
def test_assign_lanes_never_overlaps_and_uses_the_fewest_lanes(intervals):
    starts = np.array([s for s, _ in intervals])
    ends = np.array([s + d for s, d in intervals])
    lanes = assign_lanes(starts, ends)
    for lane in set(lanes):
        members = sorted((starts[i], ends[i]) for i in np.flatnonzero(lanes == lane))
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(members, members[1:]))
    # Independent optimum: the largest clique. Slices are half-open [s, e) as in Perfetto; a
    # zero-length slice at t clashes only with slices strictly around t (s < t < e).
    def clique(t: int) -> int:
        open_at = sum(1 for s, e in zip(starts, ends) if s <= t < e)
        around = sum(1 for s, e in zip(starts, ends) if s < t < e)
        instant = any(s == e == t for s, e in zip(starts, ends))
        return max(open_at, around + instant)

    points = {int(s) for s in starts} | {int(e) for e in ends}
    assert lanes.max() + 1 == max(clique(t) for t in points)
