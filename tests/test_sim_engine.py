"""Engine semantics on small cases worked out by hand: transfers, contention, the V placement's
in-memory handover, heterogeneous stages, split-backward memory, tables and errors."""

from __future__ import annotations

import time

import pandas as pd
import pytest

import schedules
from schedules import Action, Kind, Program, Schedule, ScheduleError
from schedules.timeline import MEMORY_COLUMNS, TIMELINE_COLUMNS, memory_frame, timeline_frame
from sim import CostError, CostModel, SimResult, simulate


def acts(text: str) -> tuple[Action, ...]:
    return tuple(Action.parse(t) for t in text.split())


def rows(result: SimResult, rank: int, kind: str) -> list[tuple[float, float]]:
    t = result.timeline
    t = t[(t["rank"] == rank) & (t["kind"] == kind)]
    return list(zip(t["start"], t["end"]))


@pytest.mark.parametrize("contention", [True, False])
@pytest.mark.parametrize("p,m", [(2, 3), (4, 8), (5, 2)])
def test_gpipe_with_latency(p: int, m: int, contention: bool) -> None:
    """Forward of mb j reaches rank r at r(f+c) + j f; gradients come back the same way:
    makespan (m+p-1)(f+b) + 2(p-1)c. Transfers (c <= f, b) never queue, so contention is moot."""
    f, b, c = 1.0, 2.0, 0.25
    result = simulate(
        schedules.build("gpipe", ranks=p, microbatches=m),
        CostModel(f, b, p2p_latency=0.125, p2p_bandwidth=1000.0, p2p_activation_bytes=125, link_contention=contention),
    )
    assert result.makespan == pytest.approx((m + p - 1) * (f + b) + 2 * (p - 1) * c, rel=1e-12)
    for r in range(p):
        assert [s for s, _ in rows(result, r, "F")] == pytest.approx([r * (f + c) + j * f for j in range(m)])


def test_link_contention_queues_transfers_in_issue_order() -> None:
    """p=2 GPipe, m=3, F=B=1 s, transfer 3 s (worked by hand). Forward transfers issued at
    1, 2, 3 s go on the wire at 1, 4, 7 s; gradients issued at 12, 13, 14 s at 12, 15, 18 s."""
    schedule = schedules.build("gpipe", ranks=2, microbatches=3)
    queued = simulate(schedule, CostModel(1.0, 1.0, p2p_latency=3.0, link_contention=True))
    assert rows(queued, 0, "SEND_F") == [(1, 4), (4, 7), (7, 10)]
    assert rows(queued, 1, "RECV_F") == [(0, 4), (5, 7), (8, 10)]
    assert rows(queued, 1, "F") == [(4, 5), (7, 8), (10, 11)]
    assert rows(queued, 1, "SEND_B") == [(12, 15), (15, 18), (18, 21)]
    assert rows(queued, 0, "B") == [(15, 16), (18, 19), (21, 22)]
    assert queued.makespan == 22

    free = simulate(schedule, CostModel(1.0, 1.0, p2p_latency=3.0, link_contention=False))
    assert rows(free, 0, "SEND_F") == [(1, 4), (2, 5), (3, 6)]
    assert rows(free, 1, "F") == [(4, 5), (5, 6), (6, 7)]
    assert rows(free, 0, "B") == [(11, 12), (12, 13), (13, 14)]
    assert free.makespan == 14


def test_v_placement_hands_over_in_memory() -> None:
    """p=2, V placement (stages 0,3 on rank 0; 1,2 on rank 1), m=1: four transfers, none
    between stages 1 and 2; stage 2's F starts the moment stage 1's ends."""
    order = (acts("0F0 3F0 3B0 0B0"), acts("1F0 2F0 2B0 1B0"))
    schedule = Schedule("v-hand", 2, 1, 2, (0, 1, 1, 0), order)
    program = schedules.lower(schedule)
    result = simulate(program, CostModel(2.0, 4.0, p2p_latency=0.5))
    comm = [str(a) for s in program.streams for a in s if a.kind.is_comm]
    assert sorted(comm) == sorted(
        ["0SEND_F0", "3RECV_F0", "3SEND_B0", "0RECV_B0", "1RECV_F0", "2SEND_F0", "2RECV_B0", "1SEND_B0"]
    )
    assert rows(result, 1, "F") == [(1.5, 2.5), (2.5, 3.5)]
    assert rows(result, 0, "F") == [(0, 1), (4, 5)]
    assert rows(result, 1, "B") == [(7.5, 9.5), (9.5, 11.5)]
    assert result.makespan == 2 * 2.0 + 2 * 4.0 + 4 * 0.5


def test_heterogeneous_stages() -> None:
    """GPipe p=2, m=4, F = [1, 3], B = [2, 6]: rank 1 is the bottleneck, makespan 1 + 9m + 2."""
    result = simulate(schedules.build("gpipe", ranks=2, microbatches=4), CostModel([1.0, 3.0], [2.0, 6.0]))
    assert rows(result, 1, "F") == [(1, 4), (4, 7), (7, 10), (10, 13)]
    assert rows(result, 0, "B") == [(19, 21), (25, 27), (31, 33), (37, 39)]
    assert result.makespan == 39
    assert result.busy == [12.0, 36.0]
    assert result.idle == [27.0, 3.0]


def test_split_backward_memory() -> None:
    """p=1, F0 F1 I0 I1 W0 W1, 100 bytes per microbatch of which 30 are kept from I until W."""
    schedule = Schedule("split", 1, 2, 1, (0,), (acts("0F0 0F1 0I0 0I1 0W0 0W1"),))
    for model in (
        CostModel(1.0, 2.0, 0.5, activation_memory=100, weight_memory=30),
        CostModel(1.0, 2.0, 0.5, activation_memory=100, weight_memory_fraction=0.3),
    ):
        result = simulate(schedule, model)
        memory = list(zip(result.memory["time"], result.memory["bytes"]))
        assert memory == [(0, 0), (0, 100), (1, 200), (4, 130), (6, 60), (6.5, 30), (7, 0)]
        assert result.peak_activation_bytes == [200]
        assert result.peak_activation == [2.0]


def test_split_backward_that_keeps_more_than_forward_saved() -> None:
    """p=1, F0 F1 I0 I1 W0 W1, F saves 100 bytes and W needs 160 (each weight's input and the
    output gradient I made): I allocates the other 60 when it starts, W frees 160 when it ends."""
    schedule = Schedule("split", 1, 2, 1, (0,), (acts("0F0 0F1 0I0 0I1 0W0 0W1"),))
    result = simulate(schedule, CostModel(1.0, 2.0, 0.5, activation_memory=100, weight_memory=160))
    memory = list(zip(result.memory["time"], result.memory["bytes"]))
    assert memory == [(0, 0), (0, 100), (1, 200), (2, 260), (4, 320), (6.5, 160), (7, 0)]
    assert result.peak_activation_bytes == [320]


@pytest.mark.parametrize("order, kept, expected", [
    # Stage 1 (input: 40 of its 100 bytes) gets stage 0's output (40 of its 100) in memory:
    # one storage, counted at stage 0's F and freed by whichever stage releases it last.
    ("0F0 1F0 1B0 0B0", (0, 0), [(0, 0), (0, 100), (1, 160), (4, 100), (6, 0)]),
    # Split: stage 1 keeps its input until its W, stage 0 its output until its I, which
    # comes first and so frees the 40 bytes less; 1W0 frees them.
    ("0F0 1F0 1I0 0I0 1W0 0W0", (50, 70), [(0, 0), (0, 100), (1, 160), (4, 130), (6, 120), (6.5, 50), (7, 0)]),
])
def test_stages_handing_over_on_one_rank_share_the_storage(order, kept, expected) -> None:
    schedule = Schedule("v", 1, 1, 2, (0, 0), (acts(order),))
    split = "I" in order
    costs = CostModel([1.0] * 2, [2.0] * 2 if split else None, [0.5] * 2 if split else None,
                      None if split else [2.0] * 2, activation_memory=[100, 100], weight_memory=list(kept), input_memory=[0, 40], input_weight_memory=[0, 40],
                      output_memory=[40, 0])
    result = simulate(schedule, costs)
    assert list(zip(result.memory["time"], result.memory["bytes"])) == expected


def test_static_memory_is_reported_beside_activations() -> None:
    result = simulate(
        schedules.build("1f1b", ranks=3, microbatches=6),
        CostModel(1.0, 2.0, activation_memory=10, static_memory=[1000, 2000, 3000]),
    )
    assert result.peak_activation_bytes == [30, 20, 10]
    assert result.peak_memory_bytes == [1030, 2020, 3010]
    assert result.memory["bytes"].max() == 30


def test_tables_follow_the_shared_schema() -> None:
    result = simulate(schedules.build("interleaved", ranks=2, microbatches=4, chunks=2), CostModel(1.0, 2.0))
    t = result.timeline
    assert tuple(t.columns) == TIMELINE_COLUMNS
    assert t.dtypes.equals(timeline_frame([]).dtypes)
    assert tuple(result.memory.columns) == MEMORY_COLUMNS
    assert result.memory.dtypes.equals(memory_frame([]).dtypes)
    assert set(t["source"]) == {"sim"} and set(t["step"]) == {0}
    program = result.program
    assert len(t) == program.num_actions
    assert list(t["action"]) == [str(a) for s in program.streams for a in s]
    compute = t[t["kind"].isin(["F", "B", "I", "W"])]
    assert (compute["peer"] == -1).all()
    sends = t[t["kind"] == "SEND_F"]
    assert (sends["peer"] == 1 - sends["rank"]).all()
    assert list(t[t["stage"] == 2]["chunk"].unique()) == [1]
    assert (t["end"] >= t["start"]).all()


def test_results_are_deterministic() -> None:
    schedule = schedules.build("interleaved", ranks=4, microbatches=8, chunks=3)
    model = CostModel([0.1 * (i + 1) for i in range(12)], 0.3, p2p_latency=0.01)
    first, second = simulate(schedule, model), simulate(schedule, model)
    pd.testing.assert_frame_equal(first.timeline, second.timeline)
    pd.testing.assert_frame_equal(first.memory, second.memory)


def test_deadlocked_program_raises_within_a_second() -> None:
    """Both ranks receive first: rank 0 waits for a gradient that needs rank 1's forward,
    rank 1 waits for rank 0's activation. Built by hand, bypassing validation."""
    schedule = schedules.build("gpipe", ranks=2, microbatches=1)
    program = Program(
        schedule,
        (acts("0RECV_B0 0F0 0SEND_F0 0B0"), acts("1RECV_F0 1F0 1B0 1SEND_B0")),
    )
    began = time.perf_counter()
    with pytest.raises(ScheduleError) as err:
        simulate(program, CostModel(1.0, 2.0))
    assert time.perf_counter() - began < 1.0
    message = str(err.value)
    assert "rank 0 waits at 0RECV_B0" in message and "1SEND_B0 from rank 1" in message
    assert "rank 1 waits at 1RECV_F0" in message and "0SEND_F0 from rank 0" in message
    assert "\n" not in message


def test_missing_send_is_named() -> None:
    schedule = schedules.build("gpipe", ranks=2, microbatches=2)
    program = schedules.lower(schedule)
    stream0 = tuple(a for a in program.streams[0] if str(a) != "0SEND_F1")
    began = time.perf_counter()
    with pytest.raises(ScheduleError, match=r"rank 1 waits at 1RECV_F1 .* 0SEND_F1 which no stream contains"):
        simulate(Program(schedule, (stream0, program.streams[1])), CostModel(1.0, 2.0))
    assert time.perf_counter() - began < 1.0


def test_bad_inputs() -> None:
    with pytest.raises(TypeError):
        simulate("1f1b", CostModel(1.0, 2.0))  # type: ignore[arg-type]
    with pytest.raises(CostError, match="forward lists 3 values, but the schedule has 4 stages"):
        simulate(schedules.build("1f1b", ranks=4, microbatches=4), CostModel([1.0, 1.0, 1.0], 2.0))
    bad = Schedule("bad", 2, 1, 1, (0, 1), (acts("0F0 0B0"), acts("1B0 1F0")))
    with pytest.raises(ScheduleError):
        simulate(bad, CostModel(1.0, 2.0))
    out_of_range = Program(schedules.build("gpipe", ranks=1, microbatches=1), (acts("0F0 0B0 0F5"),))
    with pytest.raises(ScheduleError, match="outside"):
        simulate(out_of_range, CostModel(1.0, 2.0))


def test_zero_costs() -> None:
    result = simulate(schedules.build("1f1b", ranks=3, microbatches=3), CostModel(0.0, 0.0))
    assert result.makespan == 0 and result.bubble_ratio == 0.0 and result.bubble_ratio_rank_span == 0.0


def test_kinds_in_timeline_cover_split_backward() -> None:
    schedule = Schedule("split2", 2, 1, 1, (0, 1), (acts("0F0 0I0 0W0"), acts("1F0 1I0 1W0")))
    result = simulate(schedule, CostModel(1.0, 2.0, 1.0))
    assert list(result.timeline["kind"]) == [
        k.value for k in (Kind.F, Kind.SEND_F, Kind.RECV_B, Kind.I, Kind.W,
                          Kind.RECV_F, Kind.F, Kind.I, Kind.SEND_B, Kind.W)
    ]
    # Rank 0's I waits for rank 1's I (ends at 4); W follows I; rank 1's W runs while rank 0's I does.
    assert rows(result, 0, "I") == [(4, 6)] and rows(result, 0, "W") == [(6, 7)]
    assert rows(result, 1, "W") == [(4, 5)]
    assert result.makespan == 7


def test_transfer_received_twice_is_named() -> None:
    """A hand-built program where two ranks wait for the same transfer: one gets it, the
    other is reported as waiting for a transfer that was already delivered."""
    schedule = schedules.build("gpipe", ranks=3, microbatches=1)
    program = schedules.lower(schedule)
    streams = (program.streams[0], program.streams[1], acts("1RECV_F0") + program.streams[2])
    with pytest.raises(ScheduleError, match="from rank 0, which sent it once, to another RECV of it"):
        simulate(Program(schedule, streams), CostModel(1.0, 2.0))
