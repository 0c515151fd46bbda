"""ZB-H1, ZB-H2, ZB-V and looped BFS: hand-checked orders, a validity grid, exact
in-flight counts, and the published closed forms reproduced exactly by the simulator.

Closed forms: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Sec. 2 and
Table 1, with T_F, T_B (input-gradient part) and T_W per rank's share, uniform stages
and zero communication: 1F1B idles (p-1)(T_F+T_B+T_W) when B = I + W, ZB-H1
(p-1)(T_F+T_B-T_W), ZB-H2 (p-1)(T_F+T_B-2T_W) per rank span, ZB-V nothing when
T_F = T_B = T_W; peak activations p (ZB-H1, ZB-V) and 2p-1 (ZB-H2) microbatches.
The cost conditions under which the handcrafted orders meet them are in the generators'
docstrings; each is tested on both sides of its boundary. Times are compared as whole
nanoseconds, so every equality is exact.
"""

from __future__ import annotations

import itertools

import pytest

import schedules
from schedules import Action, Kind, ScheduleError, build, lower, peak_in_flight
from schedules.analysis import split_forwards
from schedules.grid import unit_steps
from sim import CostModel, simulate

NS = 1_000_000_000
NEW = ["zb-h1", "zb-h2", "zbv", "looped-bfs"]
COSTS = list(itertools.product(range(1, 5), repeat=3))  # (T_F, T_B, T_W) in seconds


def rows(schedule) -> list[str]:
    return [" ".join(str(a) for a in row) for row in schedule.order]


def split_costs(f: float, b: float, w: float, **memory) -> CostModel:
    return CostModel(forward=f, backward_input=b, backward_weight=w, **memory)


def idle(result) -> list[int]:
    """Per rank, whole seconds of the makespan not spent computing (exact, from ns)."""
    return [_seconds(result.makespan_ns - busy) for busy in result.busy_ns]


def span_idle(result) -> list[int]:
    """Per rank, whole seconds idle between its first action's start and its last's end."""
    return [_seconds(end - start - busy) for (start, end), busy in zip(result.span_ns, result.busy_ns)]


def _seconds(ns: int) -> int:
    assert ns % NS == 0, f"{ns} ns is not a whole number of seconds"
    return ns // NS


# ----------------------------------------------------------------------------- registration


def test_registered_with_their_chunk_rules():
    for name in NEW:
        assert name in schedules.available()
    assert schedules.generator("zb-h1").chunks == 1
    assert schedules.generator("zb-h2").chunks == 1
    assert schedules.generator("zbv").chunks == 2
    assert schedules.generator("looped-bfs").chunks is None
    assert build("zbv", ranks=3, microbatches=6).placement == "v"
    assert build("looped-bfs", ranks=3, microbatches=6).chunks == 2
    assert build("looped-bfs", ranks=3, microbatches=6, chunks=3).placement == "looped"


def test_wrong_chunk_counts_are_rejected():
    with pytest.raises(ScheduleError, match=r"zbv runs 2 stage\(s\) per rank; got chunks=3"):
        build("zbv", ranks=4, microbatches=8, chunks=3)
    with pytest.raises(ScheduleError, match=r"zb-h1 runs 1 stage\(s\) per rank; got chunks=2"):
        build("zb-h1", ranks=4, microbatches=8, chunks=2)
    with pytest.raises(ScheduleError, match="microbatches must be a positive integer"):
        build("zb-h2", ranks=4, microbatches=0)


# ----------------------------------------------------------------------------- by hand


def test_zb_h1_by_hand_p2_m4():
    # Rank 0 is 1F1B with every B split into I, W; rank 1 runs each W one microbatch late.
    assert rows(build("zb-h1", ranks=2, microbatches=4)) == [
        "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3",
        "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3",
    ]


def test_zb_h1_by_hand_p4_m8():
    s = rows(build("zb-h1", ranks=4, microbatches=8))
    assert s[0] == "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7"
    assert s[3] == "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 3W3 3F7 3I7 3W4 3W5 3W6 3W7"


@pytest.mark.parametrize("p,m", [(1, 3), (2, 1), (3, 2), (4, 4), (4, 9), (7, 13)])
def test_zb_h1_is_1f1b_with_weight_passes_deferred(p, m):
    """Fusing each I with its W back into one B at the I's place gives 1F1B exactly, and
    on rank r, W(k) runs right after I(k+r) (or at the end when k+r >= m)."""
    zb, one = build("zb-h1", ranks=p, microbatches=m), build("1f1b", ranks=p, microbatches=m)
    for r, (row, reference) in enumerate(zip(zb.order, one.order)):
        fused = tuple(Action(a.stage, Kind.B, a.microbatch) if a.kind is Kind.I else a
                      for a in row if a.kind is not Kind.W)
        assert fused == reference
        for k in range(m):
            w = row.index(Action(r, Kind.W, k))
            if k + r < m:
                assert row[w - 1] == Action(r, Kind.I, k + r)
            else:
                assert all(a.kind is Kind.W for a in row[w:])


def test_zb_h2_by_hand_p2_m4():
    # Rank r warms up with 2(p-r)-1 forwards and runs each W 2r microbatches late.
    assert rows(build("zb-h2", ranks=2, microbatches=4)) == [
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3",
        "1F0 1I0 1F1 1I1 1F2 1I2 1W0 1F3 1I3 1W1 1W2 1W3",
    ]


def test_zb_h2_by_hand_p4_m8():
    s = rows(build("zb-h2", ranks=4, microbatches=8))
    assert s[0] == "0F0 0F1 0F2 0F3 0F4 0F5 0F6 0I0 0W0 0F7 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7"
    assert s[3] == "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3F4 3I4 3F5 3I5 3F6 3I6 3W0 3F7 3I7 3W1 3W2 3W3 3W4 3W5 3W6 3W7"


def test_zbv_by_hand_p2_m4():
    # Rank 0 holds stages 0 and 3, rank 1 stages 1 and 2 (the V). Phases per rank:
    # chunk-a forwards; (Fb, Fa) pairs; (Fb, Ib, Wb) triples; (Fa Ia Wa Fb Ib Wb) rounds; drain.
    s = build("zbv", ranks=2, microbatches=4)
    assert s.stage_to_rank == (0, 1, 1, 0)
    assert rows(s) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3",
    ]


def test_zbv_with_few_microbatches_is_the_2p_minus_1_order_cut_down():
    full = build("zbv", ranks=3, microbatches=5)
    for m in range(1, 5):
        cut = build("zbv", ranks=3, microbatches=m)
        assert cut.order == tuple(tuple(a for a in row if a.microbatch < m) for row in full.order)


def _torch_zbv_order(p: int, m: int):
    """torch.distributed.pipelining's ZB-V order, from its (private) per-rank generator."""
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    zbv = object.__new__(torch_schedules.ScheduleZBVZeroBubble)
    zbv.pp_group_size, zbv.num_stages, zbv._n_microbatches = p, 2 * p, m
    return tuple(
        tuple(Action.parse(str(a)) for a in zbv._calculate_single_rank_operations(r) if a is not None)
        for r in range(p)
    )


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_zbv_agrees_with_torch_pipelining(p):
    """An outside oracle: torch's ScheduleZBVZeroBubble runs the same ZB-V orders."""
    for m in (1, p, 2 * p - 1, 2 * p, 3 * p + 1):
        assert build("zbv", ranks=p, microbatches=m).order == _torch_zbv_order(p, m)


def test_looped_bfs_by_hand_p2_m3_v2():
    s = build("looped-bfs", ranks=2, microbatches=3, chunks=2)
    assert s.stage_to_rank == (0, 1, 0, 1)
    assert rows(s) == [
        "0F0 0F1 0F2 2F0 2F1 2F2 2B0 2B1 2B2 0B0 0B1 0B2",
        "1F0 1F1 1F2 3F0 3F1 3F2 3B0 3B1 3B2 1B0 1B1 1B2",
    ]


@pytest.mark.parametrize("p,m", [(1, 1), (2, 5), (4, 3), (5, 8)])
def test_looped_bfs_with_one_chunk_is_gpipe(p, m):
    assert build("looped-bfs", ranks=p, microbatches=m, chunks=1).order == build("gpipe", ranks=p, microbatches=m).order


# ----------------------------------------------------------------------------- validity, in flight


def expected_peak_in_flight(name: str, p: int, m: int, v: int) -> list[int]:
    """Microbatches (chunk-microbatches for v > 1) with F done and W (or B) not yet, per rank.

    ZB-H1: warm-up p-r plus W delay r = p on every rank; ZB-H2: (2p-2r-1) + 2r = 2p-1;
    ZB-V: the peak comes just before the first W (phase 3): 2p-1-r forwards of chunk a
    and r+1 of chunk b, each capped at m (2p once m >= 2p-1); looped BFS: every forward
    before any backward.
    """
    if name == "zb-h1":
        return [min(p, m)] * p
    if name == "zb-h2":
        return [min(2 * p - 1, m)] * p
    if name == "zbv":
        return [min(2 * p - 1 - r, m) + min(r + 1, m) for r in range(p)]
    return [m * v] * p


@pytest.mark.parametrize("p", range(1, 9))
def test_every_new_schedule_validates_lowers_and_holds_exactly_its_peak(p):
    variants = [("zb-h1", 1), ("zb-h2", 1), ("zbv", 2)] + [("looped-bfs", v) for v in (1, 2, 3)]
    for m in range(1, 4 * p + 1):
        for name, v in variants:
            schedule = build(name, ranks=p, microbatches=m, chunks=v)
            program = lower(schedule)
            assert tuple(tuple(a for a in s if a.kind.is_compute) for s in program.streams) == schedule.order
            assert schedule.uses_split_backward == (name != "looped-bfs")
            assert peak_in_flight(schedule) == expected_peak_in_flight(name, p, m, v), (name, m, v)
    assert expected_peak_in_flight("zbv", p, 2 * p - 1, 2) == [2 * p] * p


@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (4, 8), (4, 13), (8, 16)])
def test_peak_activation_memory_in_the_simulator(p, m):
    """Rank-share units. Keeping all of a microbatch's activations until W (M_W = M_B):
    ZB-H1 and ZB-V hold p on every rank, ZB-H2 2p-1. Freeing them all at I (M_W = 0):
    ZB-H1 holds 1F1B's p-r on rank r, ZB-H2 2p-1-2r, ZB-V still p."""
    until_w = split_costs(1, 1, 1, activation_memory=4096, weight_memory_fraction=1.0)
    until_i = split_costs(1, 1, 1, activation_memory=4096, weight_memory_fraction=0.0)
    expect = {
        "zb-h1": ([p] * p, [p - r for r in range(p)]),
        "zb-h2": ([2 * p - 1] * p, [2 * p - 1 - 2 * r for r in range(p)]),
        "zbv": ([p] * p, [p] * p),
    }
    for name, (held_until_w, held_until_i) in expect.items():
        schedule = build(name, ranks=p, microbatches=m)
        assert simulate(schedule, until_w).peak_activation == held_until_w
        assert simulate(schedule, until_i).peak_activation == held_until_i
    assert max(expect["zb-h1"][0]) == max(expect["zbv"][0]) == p
    assert max(expect["zb-h2"][0]) == 2 * p - 1


# ----------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("p,m", [(2, 2), (3, 7), (4, 8), (5, 5)])
def test_1f1b_bubble_with_fused_backward(p, m):
    """1F1B runs B = I + W fused: every rank idles (p-1)(T_F+T_B+T_W), for any costs."""
    schedule = build("1f1b", ranks=p, microbatches=m)
    for f, b, w in COSTS:
        assert idle(simulate(schedule, split_costs(f, b, w))) == [(p - 1) * (f + b + w)] * p


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_zb_h1_bubble_closed_form(p):
    """m >= p: exactly when T_W <= T_F and T_W <= T_B, every rank idles (p-1)(T_F+T_B-T_W)
    of the makespan and rank r (p-1-r)(T_F+T_B-T_W) of its span; in general the makespan
    idle is (p-1)(T_F+T_B-min(T_F,T_B,T_W)). With m < p the pipeline never fills."""
    for m in (p, p + 1, 2 * p, 3 * p + 1):
        schedule = build("zb-h1", ranks=p, microbatches=m)
        for f, b, w in COSTS:
            result = simulate(schedule, split_costs(f, b, w))
            paper = (p - 1) * (f + b - w)
            closed = (idle(result), span_idle(result)) == ([paper] * p, [(p - 1 - r) * (f + b - w) for r in range(p)])
            assert closed == (w <= f and w <= b), (m, f, b, w)
            assert idle(result) == [(p - 1) * (f + b - min(f, b, w))] * p
    for m in range(1, p):
        result = simulate(build("zb-h1", ranks=p, microbatches=m), split_costs(1, 1, 1))
        assert min(idle(result)) > p - 1  # (p-1)(T_F+T_B-T_W) at unit costs


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_zb_h2_bubble_closed_form(p):
    """m >= 2p-1: exactly when T_W <= T_F and 2T_W <= T_F+T_B, rank r idles
    (p-1-r)(T_F+T_B-2T_W) of its span, the paper's (p-1)(T_F+T_B-2T_W) on rank 0, and
    every rank (p-1)max(T_F, T_F+T_B-2T_W) of the makespan (the spans are staggered)."""
    for m in (2 * p - 1, 2 * p, 3 * p + 1):
        schedule = build("zb-h2", ranks=p, microbatches=m)
        for f, b, w in COSTS:
            result = simulate(schedule, split_costs(f, b, w))
            per_rank = [(p - 1 - r) * (f + b - 2 * w) for r in range(p)]
            holds = w <= f and 2 * w <= f + b
            assert (span_idle(result) == per_rank) == holds, (m, f, b, w)
            if holds:
                assert max(span_idle(result)) == (p - 1) * (f + b - 2 * w)
                assert idle(result) == [(p - 1) * max(f, f + b - 2 * w)] * p


@pytest.mark.parametrize("p", range(1, 9))
def test_zb_h2_and_zbv_have_no_bubble_with_equal_unit_costs(p):
    """Independent of the simulator: with every action one step (schedules.grid), each rank
    of ZB-H2 (m >= 2p-1) and of ZB-V (m >= 2p-1; one step per chunk action, i.e. T_F = T_B =
    T_W) computes on consecutive steps from its first action to its last. One microbatch
    fewer, ZB-H2's rank 0 and ZB-V's ranks wait somewhere."""
    for name in ("zb-h2", "zbv"):
        for m in range(2 * p - 1, 4 * p + 1):
            for starts in unit_steps(build(name, ranks=p, microbatches=m)):
                assert starts == list(range(starts[0], starts[0] + len(starts)))
        if p > 1:
            starts = unit_steps(build(name, ranks=p, microbatches=2 * p - 2))
            assert any(s != list(range(s[0], s[0] + len(s))) for s in starts)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 8])
def test_zbv_zero_bubble_per_rank_span(p):
    """T_F = T_B = T_W and m >= 2p (also m = 2p-1): no rank idles within its span."""
    for t in (1, 3):
        for m in (2 * p - 1, 2 * p, 2 * p + 1, 3 * p, 4 * p):
            result = simulate(build("zbv", ranks=p, microbatches=m), split_costs(t, t, t))
            assert span_idle(result) == [0] * p
            assert result.bubble_ratio_rank_span == 0.0


@pytest.mark.parametrize("p,v", list(itertools.product([1, 2, 3, 4], [1, 2, 3])))
def test_looped_bfs_bubble_ratio_and_memory(p, v):
    """m >= p: no rank waits between loops, so the makespan is (v m + p - 1)(T_F+T_B)/v and
    the bubble ratio (p-1)/(v m + p-1); every rank holds all m microbatches at the turn."""
    for m in (p, p + 1, 2 * p + 3):
        schedule = build("looped-bfs", ranks=p, microbatches=m, chunks=v)
        for f, b in [(1, 2), (3, 1), (2, 2)]:
            result = simulate(schedule, CostModel(forward=v * f, backward_full=v * b))
            assert result.makespan_ns == (v * m + p - 1) * (f + b) * NS
            assert result.bubble_ratio == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12, abs=0)
            assert result.peak_activation == [m] * p


@pytest.mark.parametrize("name,chunks,split", [("zb-h1", None, 4), ("zb-h2", None, 4), ("zbv", None, 8),
                                                ("1f1b", None, 0), ("gpipe", None, 0), ("interleaved", 2, 0)])
def test_split_forwards_are_the_forwards_whose_backward_is_split(name, chunks, split):
    """schedules.analysis.split_forwards marks exactly the F actions of a stage and microbatch
    that also have an I: every forward of the zero-bubble family (m = 4 at p = 2: 4 per rank, ZB-V
    8 with its two stages per rank), none of the schedules with a fused B."""
    for stream in lower(build(name, ranks=2, microbatches=4, chunks=chunks)).streams:
        flags = split_forwards(stream)
        assert sum(flags) == split
        assert all(a.kind is Kind.F for a, on in zip(stream, flags) if on)


def test_split_forwards_of_a_stream_that_splits_some_backwards():
    """A hand-written stream: F of microbatch 0 has its backward split, microbatch 1's is fused."""
    stream = [Action(0, Kind.F, 0), Action(0, Kind.F, 1), Action(0, Kind.B, 1), Action(0, Kind.I, 0),
              Action(0, Kind.W, 0)]
    assert split_forwards(stream) == [True, False, False, False, False]
