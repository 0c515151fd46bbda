"""Transfers slowed by the ranks that compute meanwhile (CostModel.p2p_load_latency).

A transfer of time t on an idle machine advances at 1 / (t + load x k) of its whole per
second, k the ranks computing at that moment (sim.engine.Wire): hand-computed timelines, and
every transfer of random programs checked against that law integrated over the result's own
compute rows (an oracle that shares no code with the engine).
"""

from __future__ import annotations

import random

import pytest

import schedules
from sim import CostError, CostModel, simulate


def rows(result) -> dict[str, tuple[float, float]]:
    t = result.timeline
    return {a: (s, e) for a, s, e in zip(t["action"], t["start"], t["end"])}


def test_gpipe_by_hand() -> None:
    """F = 1, B = 2 s, latency 0.1 s, 0.5 s more per computing rank. Every transfer here is on
    the wire while exactly one rank computes (rank 0's F1, rank 1's F0, B1, rank 0's B0), so
    each takes 0.6 s: rank 1 starts at 1.6, the step ends at 10.2 s instead of 9.2."""
    plain = CostModel(forward=1.0, backward_full=2.0, p2p_latency=0.1)
    loaded = CostModel(forward=1.0, backward_full=2.0, p2p_latency=0.1, p2p_load_latency=0.5)
    schedule = schedules.build("gpipe", ranks=2, microbatches=2)
    assert simulate(schedule, plain).makespan == pytest.approx(9.2)
    result = simulate(schedule, loaded)
    got = rows(result)
    assert got["0SEND_F0"] == pytest.approx((1.0, 1.6)) and got["1F0"] == pytest.approx((1.6, 2.6))
    assert got["0SEND_F1"] == pytest.approx((2.0, 2.6)) and got["1F1"] == pytest.approx((2.6, 3.6))
    assert got["1SEND_B0"] == pytest.approx((5.6, 6.2)) and got["0B0"] == pytest.approx((6.2, 8.2))
    assert result.makespan == pytest.approx(10.2)


def test_a_transfer_speeds_up_when_the_computing_stops() -> None:
    """Rank 0's F0 ends at 0.3 and its F1 runs to 0.6: the first transfer does half its whole
    in 0.3 s at k = 1 (0.6 s for all of it), the other half at k = 0 (0.1 s for all): it arrives
    at 0.65. The second waits on the link until then and runs beside rank 1's F0 (k = 1): 1.25."""
    model = CostModel(forward=[0.3, 1.0], backward_full=2.0, p2p_latency=0.1, p2p_load_latency=0.5)
    got = rows(simulate(schedules.build("gpipe", ranks=2, microbatches=2), model))
    assert got["0SEND_F0"] == pytest.approx((0.3, 0.65))
    assert got["1F0"] == pytest.approx((0.65, 1.65))
    assert got["0SEND_F1"] == pytest.approx((0.65, 1.25))  # starts when the link is free


def computing(result, t0: float, t1: float) -> list[tuple[float, int]]:
    """(seconds, ranks computing) pieces of [t0, t1] from the result's compute rows."""
    compute = result.timeline[result.timeline["kind"].isin(["F", "B", "I", "W"])]
    spans = [(s, e) for s, e in zip(compute["start"], compute["end"]) if e > s]
    cuts = sorted({t0, t1, *(x for s, e in spans for x in (s, e) if t0 < x < t1)})
    return [(b - a, sum(1 for s, e in spans if s <= a and e >= b)) for a, b in zip(cuts, cuts[1:])]


@pytest.mark.parametrize("seed", range(10))
def test_every_transfer_obeys_the_rate_law(seed: int) -> None:
    """Random schedules, costs, link contention and processor sharing: every SEND row (from the
    transfer's start on its link to its arrival) integrates 1 / (t + load x k(t)) to 1 (to the
    engine's whole-nanosecond rounding), and its RECV ends no earlier than it arrives."""
    rng = random.Random(seed)
    name = rng.choice(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zbv", "dualpipev"])
    p = rng.choice([2, 4])
    m = rng.choice([p, 2 * p])
    schedule = schedules.build(name, ranks=p, microbatches=m, chunks=2 if name == "interleaved" else None)
    latency, load = rng.uniform(0.01, 0.2), rng.uniform(0.05, 0.5)
    model = CostModel(forward=rng.uniform(0.5, 2), backward_input=rng.uniform(0.5, 2),
                      backward_weight=rng.uniform(0.1, 1), p2p_latency=latency, p2p_load_latency=load,
                      link_contention=rng.random() < 0.5, send_overhead=rng.choice([0.0, 0.02]),
                      cores=rng.choice([None, 1, p - 1]))
    result = simulate(schedule, model)
    got = rows(result)
    comm = [a for stream in schedules.lower(schedule).streams for a in stream if a.kind.is_comm]
    receive = {a.transfer: str(a) for a in comm if not a.kind.is_send}
    sends = [a for a in comm if a.kind.is_send]
    assert sends
    for action in sends:
        start, end = got[str(action)]
        done = sum(d / (latency + load * k) for d, k in computing(result, start, end))
        assert done == pytest.approx(1.0, abs=1e-6 + 2e-9 / latency)
        assert got[receive[action.transfer]][1] >= end - 1e-12


def test_no_load_is_the_plain_engine() -> None:
    schedule = schedules.build("zb-h1", ranks=4, microbatches=8)
    base = dict(forward=1.0, backward_input=1.0, backward_weight=0.5, p2p_latency=0.05)
    plain, zero = simulate(schedule, CostModel(**base)), simulate(schedule, CostModel(**base, p2p_load_latency=0.0))
    assert plain.makespan == zero.makespan
    assert plain.timeline.equals(zero.timeline)


def test_load_latency_is_validated() -> None:
    with pytest.raises(CostError, match="p2p_load_latency must be a finite number >= 0"):
        CostModel(forward=1.0, backward_full=2.0, p2p_load_latency=-0.1)


@pytest.mark.parametrize("seed", range(12))
def test_a_send_that_wakes_its_receiver_costs_its_rank_more(seed: int) -> None:
    """Random schedules, with and without the load law, on shared cores or a core per rank: a
    rank moves on from each SEND send_overhead after it, and wake_overhead more where the ranks
    share cores, the transfer's RECV started strictly earlier (its receiver waits for it) and
    the ranks computing at the SEND, read from the result's own rows, and the sender fill the
    cores; on cores of their own never. Both kinds occur where cores are shared."""
    rng = random.Random(100 + seed)
    name = rng.choice(["gpipe", "1f1b", "interleaved", "zb-h1", "zbv"])
    p = rng.choice([2, 4])
    cores = [None, 1, p // 2][seed % 3]
    schedule = schedules.build(name, ranks=p, microbatches=2 * p, chunks=2 if name == "interleaved" else None)
    send, wake = 0.02, 0.07
    model = CostModel(forward=rng.uniform(0.5, 2), backward_input=rng.uniform(0.5, 2),
                      backward_weight=rng.uniform(0.1, 1), p2p_latency=rng.uniform(0.01, 0.2),
                      p2p_load_latency=rng.choice([0.0, 0.3]), link_contention=False, send_overhead=send,
                      wake_overhead=wake, cores=cores)
    result = simulate(schedule, model)
    got = rows(result)
    compute = result.timeline[result.timeline["kind"].isin(["F", "B", "I", "W"])]
    streams = schedules.lower(schedule).streams
    receive = {a.transfer: str(a) for stream in streams for a in stream if a.kind.is_recv}
    woke = []
    for stream in streams:
        for action, following in zip(stream, stream[1:]):
            if action.kind.is_send:
                start = got[str(action)][0]
                computing = int(((compute["start"] <= start) & (compute["end"] > start)).sum())
                woke.append(cores is not None and got[receive[action.transfer]][0] < start
                            and computing + 1 >= cores)
                assert got[str(following)][0] - start == pytest.approx(send + wake * woke[-1], abs=1e-8)
    assert (any(woke) and not all(woke)) if cores is not None else not any(woke)
