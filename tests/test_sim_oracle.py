"""The SimPy engine against an independent oracle: a longest-path evaluation of the program's graph.

The oracle knows nothing of the engine. It builds the dependency graph of a lowered program
(start and end node per action; stream order on each rank; a SEND's start feeds its RECV's end
after the transfer time) and evaluates longest paths in topological order. Without link
contention, every start and end time must agree exactly (integer nanoseconds), and so must the
memory table, busy time, makespan and bubble ratio. Cases: random valid schedules on random
placements (V-like adjacent stages on one rank included) with random split backward, and every
registered schedule at random sizes, all with random heterogeneous per-stage costs and random
executor overheads (rank time per SEND and per RECV, none more for a SEND that wakes its
receiver as no rank shares a core here, the step overhead added to the makespan,
the cost of a compute action that does not repeat its rank's previous one, and the posting of
the receives a rank posts before its first action, counted here from the stream alone).

Link contention (one transfer at a time per directed link, in issue order) is one more kind of
edge in the same graph, so the oracle checks it too, on a further set of random cases.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict, deque

import pytest

import schedules
from schedules import Action, Kind, Schedule, ScheduleError
from sim import CostModel, simulate
from sim.costs import spread_factors

NS = 1_000_000_000
BANDWIDTH = 1e9  # bytes per second: one byte per nanosecond, so transfer ns = latency ns + bytes


# --------------------------------------------------------------------------- random inputs
def random_schedule(rng: random.Random) -> Schedule:
    """A valid schedule: random placement, random B-or-split per (stage, microbatch), random
    topological interleaving of the compute dependency graph (which cannot deadlock)."""
    p, v, m = rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 5)
    n = p * v
    stages = list(range(n))
    rng.shuffle(stages)
    s2r = [0] * n
    for i, stage in enumerate(stages):
        s2r[stage] = i // v
    split = {(s, mb): rng.random() < 0.5 for s in range(n) for mb in range(m)}

    def deps(a: Action) -> list[tuple[int, Kind | None]]:
        s, mb = a.stage, a.microbatch
        if a.kind is Kind.F:
            return [(s - 1, Kind.F)] if s > 0 else []
        if a.kind is Kind.W:
            return [(s, Kind.I)]
        out = [(s, Kind.F)]
        if s < n - 1:
            out.append((s + 1, Kind.I if split[(s + 1, mb)] else Kind.B))
        return out

    todo = []
    for s in range(n):
        for mb in range(m):
            todo.append(Action(s, Kind.F, mb))
            todo += [Action(s, Kind.I, mb), Action(s, Kind.W, mb)] if split[(s, mb)] else [Action(s, Kind.B, mb)]
    done: set[Action] = set()
    order: list[list[Action]] = [[] for _ in range(p)]
    while todo:
        ready = [a for a in todo if all(Action(s, k, a.microbatch) in done for s, k in deps(a))]
        pick = rng.choice(ready)
        todo.remove(pick)
        done.add(pick)
        order[s2r[pick.stage]].append(pick)
    return Schedule("random", p, m, v, tuple(s2r), tuple(tuple(r) for r in order))


def registered_schedule(rng: random.Random) -> Schedule:
    """A registered schedule at random legal sizes."""
    for _ in range(100):
        name = rng.choice(schedules.available())
        p, m = rng.randint(1, 5), rng.randint(1, 10)
        chunks = rng.randint(2, 3) if schedules.generator(name).chunks is None else None
        try:
            return schedules.build(name, ranks=p, microbatches=m, chunks=chunks)
        except ScheduleError:
            continue
    raise AssertionError("no legal registered schedule found")


def random_costs(rng: random.Random, schedule: Schedule, contention: bool = False, growth: bool = True) -> CostModel:
    """Per-stage costs in whole microseconds, transfers in whole nanoseconds; compute that grows
    into the step in some (unless `growth` is false)."""
    n = schedule.num_stages

    def us(lo: int, hi: int) -> list[float]:
        return [rng.randint(lo, hi) * 1e-6 for _ in range(n)]

    inp, weight = us(0, 40), us(0, 20)
    full = None if rng.random() < 0.5 else us(1, 60)
    memory = [rng.randint(0, 1000) for _ in range(n)]
    inputs = [rng.choice([0, rng.randint(0, x // 2)]) for x in memory]
    outputs = [rng.choice([0, rng.randint(0, x // 2)]) for x in memory]
    return CostModel(
        forward=us(0, 30),
        forward_split=None if rng.random() < 0.3 else us(0, 40),
        backward_input=inp,
        backward_weight=weight,
        backward_full=full,
        p2p_latency=rng.randint(0, 20) * 1e-6,
        p2p_bandwidth=BANDWIDTH,
        p2p_activation_bytes=[rng.randint(0, 5000) for _ in range(max(n - 1, 0))],
        p2p_gradient_bytes=None if rng.random() < 0.5 else [rng.randint(0, 5000) for _ in range(max(n - 1, 0))],
        activation_memory=memory,
        weight_memory=[rng.randint(0, 2 * x) for x in memory],  # W may keep more than F saved
        # Of a stage's activations, its input's and its output's storages, each held until I
        # or until W; where stage s-1 hands over to s on one rank these are shared.
        input_memory=inputs,
        input_weight_memory=[rng.choice([0, x]) for x in inputs],
        output_memory=outputs,
        output_weight_memory=[rng.choice([0, x]) for x in outputs],
        link_contention=contention,
        send_overhead=rng.choice([0, rng.randint(1, 5)]) * 1e-6,
        # a SEND's wake costs its rank only where ranks share cores, which no case here does
        wake_overhead=rng.choice([0, rng.randint(1, 9)]) * 1e-6,
        recv_overhead=rng.choice([0, rng.randint(1, 5)]) * 1e-6,
        step_overhead=rng.randint(0, 50) * 1e-6,
        post_overhead=rng.choice([0, rng.randint(1, 9)]) * 1e-6,
        post_ahead=rng.choice([0, 1, 2, "step"]),
        switch_forward=rng.choice([0, rng.randint(1, 9)]) * 1e-6,
        switch_backward=rng.choice([0, rng.randint(1, 9)]) * 1e-6,
        repeat_discount_forward=rng.choice([0.0, 0.3, 0.5, 0.9]),
        repeat_discount_backward=rng.choice([0.0, 0.3, 0.5, 0.9]),
        place_factors={k: [rng.choice([0.5, 0.75, 1.0, 1.3, 2.0]) for _ in range(rng.randint(0, 3))]
                       for k in rng.sample(["F", "B", "I", "W"], rng.randint(0, 4))},
        # per second into the step, up to a horizon of 50 us to 2 ms: at most x1.6, at least x0.6
        compute_growth=rng.choice([0.0, 0.0, -200.0, 300.0, 1000.0]) if growth else 0.0,
        growth_horizon=rng.randint(50, 2000) * 1e-6 if growth else 0.0,
    )


# --------------------------------------------------------------------------------- oracle
def durations(costs: CostModel, action: Action, split: bool = False) -> int:
    """Compute time in ns from the raw per-stage lists (B = I + W unless given; an F whose
    backward is `split` costs forward_split where given)."""
    s = action.stage
    ns = lambda x: round(x[s] * NS)  # noqa: E731
    if action.kind is Kind.F:
        return ns(costs.forward_split if split and costs.forward_split is not None else costs.forward)
    if action.kind is Kind.I:
        return ns(costs.backward_input)
    if action.kind is Kind.W:
        return ns(costs.backward_weight)
    if costs.backward_full is not None:
        return ns(costs.backward_full)
    return ns(costs.backward_input) + ns(costs.backward_weight)


def own_time(costs: CostModel, action: Action, repeats: int, factor: float = 1.0, earlier: int = 0,
             split: bool = False) -> int:
    """Least time an action occupies its rank: compute time (times its place factor when it is
    among the first `len(place_factors[kind])` of its stage and kind on the rank, `earlier`
    being how many came before it; times 1 - discount x (repeats - 1) / repeats when `repeats`,
    the compute actions of its stage and kind the rank ran just before it with none between, is
    2 or more; plus the switch cost when it is 0; times `factor`, a spread draw's; an F whose
    backward is `split` priced as such), or the SEND/RECV overhead."""
    if action.kind.is_compute:
        forward = action.kind is Kind.F
        switch = costs.switch_forward if forward else costs.switch_backward
        discount = costs.repeat_discount_forward if forward else costs.repeat_discount_backward
        base = durations(costs, action, split)
        placed = dict(costs.place_factors).get(action.kind.value, ())
        scale = placed[earlier] if earlier < len(placed) else 1.0
        if repeats >= 2:
            scale *= 1 - discount * (repeats - 1) / repeats
        if scale != 1.0:
            base = round(base * scale)
        own = base + (0 if repeats else round(switch * NS))
        return own if factor == 1.0 else round(own * factor)
    return round((costs.send_overhead if action.kind.is_send else costs.recv_overhead) * NS)


def first_receives(costs: CostModel, stream) -> int:
    """Receives a rank posts before its first action: every RECV of its stream with whole-step
    posting; with k compute actions ahead, each RECV with fewer than k compute actions before
    it, or exactly k when the stream opens with a compute action (the receive then goes just
    before that first compute); none when each receive is posted at its RECV."""
    if costs.post_ahead == "step":
        return sum(a.kind.is_recv for a in stream)
    k, count, computes = costs.post_ahead, 0, 0
    for action in stream:
        if action.kind.is_recv and k and (computes < k or (computes == k and stream[0].kind.is_compute)):
            count += 1
        computes += action.kind.is_compute
    return count


def transfer_ns(costs: CostModel, send: Action) -> int:
    boundary = min(send.stage, send.peer_stage())
    sizes = costs.p2p_activation_bytes
    if send.kind is Kind.SEND_B and costs.p2p_gradient_bytes is not None:
        sizes = costs.p2p_gradient_bytes
    return round(costs.p2p_latency * NS) + round(sizes[boundary])  # one byte per ns


def critical_path(program, costs: CostModel, factors=None, transfer_factors=None) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, index) -> (start, end): longest paths over the program's dependency graph.

    Nodes: ('s', rank, i) and ('e', rank, i) per action, plus ('w', rank, i), the moment a
    SEND's transfer goes on the wire. Edges: e(i-1) -> s(i) (stream order); s(i) -> e(i)
    weighted by the compute time (plus the switch cost if the rank's previous compute action
    had another stage or kind; a long run's repeats at their discount; send_overhead for a SEND, recv_overhead for a RECV: e of a
    SEND is when its rank moves on); s(SEND) -> w(SEND); w(SEND) ->
    e(RECV) weighted by the transfer time; with link contention also w(previous SEND on the
    same directed link) -> w(SEND), weighted by that previous transfer's time. A SEND's row
    is its time on the wire. A rank's first start node begins at post_overhead times
    `first_receives`. `factors[rank][i]` (optional) scales compute action i of rank,
    `transfer_factors[rank][i]` the transfer time of SEND i of rank. A compute action's edge is
    then times 1 + compute_growth x min(start, growth_horizon), its start being its s node's
    longest path, known when the node is taken in topological order, rounded to the ns.
    """
    rate, horizon = costs.compute_growth / NS, round(costs.growth_horizon * NS)  # per ns, ns
    computing = set()
    s2r = program.schedule.stage_to_rank
    edges: dict[tuple, list[tuple[tuple, int]]] = defaultdict(list)
    nodes = []
    where = {}

    def wire_ns(rank: int, i: int, action: Action) -> int:
        ns = transfer_ns(costs, action)
        return ns if transfer_factors is None else round(ns * transfer_factors[rank][i])

    last_on_link: dict[tuple[int, int], tuple[tuple, int]] = {}
    for rank, stream in enumerate(program.streams):
        for i, action in enumerate(stream):
            start, end = ("s", rank, i), ("e", rank, i)
            nodes += [start, end]
            where[action] = (rank, i)
            factor = 1.0 if factors is None else factors[rank][i]
            earlier = sum(1 for a in stream[:i] if (a.stage, a.kind) == (action.stage, action.kind))
            before = [a for a in stream[:i] if a.kind.is_compute]
            repeats = 0
            while repeats < len(before) and (before[-1 - repeats].stage, before[-1 - repeats].kind) == (
                    action.stage, action.kind):
                repeats += 1
            split = action.kind is Kind.F and any(a.kind is Kind.I and (a.stage, a.microbatch) == (
                action.stage, action.microbatch) for a in stream)
            edges[start].append((end, own_time(costs, action, repeats, factor, earlier, split)))
            if action.kind.is_compute:
                computing.add(start)
            if i > 0:
                edges[("e", rank, i - 1)].append((start, 0))
            if action.kind.is_send:
                wire, link = ("w", rank, i), (rank, s2r[action.peer_stage()])
                nodes.append(wire)
                edges[start].append((wire, 0))
                if costs.link_contention and link in last_on_link:
                    previous, busy = last_on_link[link]
                    edges[previous].append((wire, busy))
                last_on_link[link] = (wire, wire_ns(rank, i, action))
    for action, (rank, i) in where.items():
        if action.kind.is_send:
            r2, i2 = where[action.matching()]
            edges[("w", rank, i)].append((("e", r2, i2), wire_ns(rank, i, action)))
    indegree = {node: 0 for node in nodes}
    for u in edges:
        for v, _ in edges[u]:
            indegree[v] += 1
    dist = {node: 0 for node in nodes}
    for rank, stream in enumerate(program.streams):  # a rank starts after posting its first receives
        if stream:
            dist[("s", rank, 0)] = round(costs.post_overhead * NS) * first_receives(costs, stream)
    queue = deque(node for node in nodes if indegree[node] == 0)
    seen = 0
    while queue:
        u = queue.popleft()
        seen += 1
        for v, w in edges[u]:
            if rate and u in computing and w:
                w = round(w * (1.0 + rate * min(dist[u], horizon)))
            dist[v] = max(dist[v], dist[u] + w)
            indegree[v] -= 1
            if indegree[v] == 0:
                queue.append(v)
    assert seen == len(nodes), "the program's graph has a cycle"
    out = {}
    for action, (rank, i) in where.items():
        if action.kind.is_send:
            wire = dist[("w", rank, i)]
            out[(rank, i)] = (wire, wire + wire_ns(rank, i, action))
        else:
            out[(rank, i)] = (dist[("s", rank, i)], dist[("e", rank, i)])
    return out


def shared_storages(program, costs: CostModel) -> dict[int, tuple[int, bool, bool]]:
    """Per stage s handed its input by stage s-1 on the same rank: (bytes of the storage both
    hold, whether s-1 holds it until its W, whether s does)."""
    s2r = program.schedule.stage_to_rank
    out = {}
    for s in range(1, len(s2r)):
        h = min(costs.output_memory[s - 1], costs.input_memory[s])
        if s2r[s] == s2r[s - 1] and h > 0:
            out[s] = (h, costs.output_weight_memory[s - 1] >= h, costs.input_weight_memory[s] >= h)
    return out


def memory_changes(program, costs: CostModel, times) -> dict[int, list[tuple[int, int]]]:
    """Per rank, (time ns, bytes held) after every change, from blocks of bytes each with its
    own life: a stage's own bytes (M and K less the shared storages it holds: +M' at F, -M'
    at B, K' - M' at I, -K' at W) and each shared storage (+h at the sender's F, -h at the
    later of the two stages' releases: B, or I or W as each holds it). An action's change is
    the sum of its blocks', at its start if positive, else at its end."""
    shared = shared_storages(program, costs)
    out = {}
    for rank, stream in enumerate(program.streams):
        delta_at = defaultdict(int)
        releases = defaultdict(list)  # (receiving stage, mb) -> positions releasing the storage
        for i, action in enumerate(stream):
            s, kind, mb = action.stage, action.kind, action.microbatch
            if kind not in (Kind.F, Kind.B, Kind.I, Kind.W):
                continue
            m, k = costs.activation_memory[s], costs.weight_memory[s]
            for pair, receiver in ((s, True), (s + 1, False)):
                if pair in shared:
                    h, sender_until_w, receiver_until_w = shared[pair]
                    until_w = receiver_until_w if receiver else sender_until_w
                    m -= h
                    k -= h if until_w else 0
                    if kind is Kind.B or (kind is Kind.W) == until_w and kind is not Kind.F:
                        releases[(pair, mb)].append(i)
                    if kind is Kind.F and not receiver:
                        delta_at[i] += h
            delta_at[i] += {Kind.F: m, Kind.B: -m, Kind.I: k - m, Kind.W: -k}[kind]
        for (pair, _), positions in releases.items():
            if len(positions) == 2:
                delta_at[max(positions)] -= shared[pair][0]
        held, changes = 0, []
        for i, action in enumerate(stream):
            delta = delta_at.get(i, 0)
            if delta:
                held += delta
                changes.append((times[(rank, i)][0 if delta > 0 else 1], held))
        out[rank] = changes
    return out


# ---------------------------------------------------------------------------------- tests
def check_against_oracle(schedule: Schedule, costs: CostModel) -> None:
    program = schedules.lower(schedule)
    result = simulate(program, costs)
    expected = critical_path(program, costs)
    timeline = result.timeline
    assert len(timeline) == program.num_actions
    got = {
        (int(r), int(i)): (round(s * NS), round(e * NS))
        for r, group in timeline.groupby("rank", sort=True)
        for i, (s, e) in enumerate(zip(group["start"], group["end"]))
    }
    mismatches = [(k, got[k], expected[k]) for k in expected if got[k] != expected[k]]
    assert not mismatches, f"{schedule.describe()}: engine vs oracle (first 5): {mismatches[:5]}"

    makespan = max(end for _, end in expected.values())
    assert result.makespan_ns == makespan
    assert result.step_time == (makespan + round(costs.step_overhead * NS)) / NS
    busy = [0] * schedule.ranks
    for (rank, i), (start, end) in expected.items():
        if program.streams[rank][i].kind.is_compute:
            busy[rank] += end - start
    assert list(result.busy_ns) == busy
    if makespan:
        assert result.bubble_ratio == pytest.approx(1 - sum(busy) / (schedule.ranks * makespan), rel=1e-12)

    changes = memory_changes(program, costs, expected)
    for rank in range(schedule.ranks):
        rows = result.memory[result.memory["rank"] == rank]
        got_rows = [(round(t * NS), int(b)) for t, b in zip(rows["time"], rows["bytes"])]
        assert got_rows == [(0, 0)] + changes[rank]
        assert result.peak_activation_bytes[rank] == max([0] + [b for _, b in changes[rank]])


@pytest.mark.parametrize("seed", range(250))
def test_random_schedules_match_oracle(seed: int) -> None:
    rng = random.Random(seed)
    schedule = random_schedule(rng)
    check_against_oracle(schedule, random_costs(rng, schedule))


@pytest.mark.parametrize("seed", range(100))
def test_registered_schedules_match_oracle(seed: int) -> None:
    rng = random.Random(10_000 + seed)
    schedule = registered_schedule(rng)
    check_against_oracle(schedule, random_costs(rng, schedule))


@pytest.mark.parametrize("name", schedules.available())
@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8)])
def test_every_registered_schedule_matches_oracle(name: str, p: int, m: int) -> None:
    rng = random.Random(f"{name}-{p}-{m}")
    chunks = 3 if schedules.generator(name).chunks is None else None
    try:
        schedule = schedules.build(name, ranks=p, microbatches=m, chunks=chunks)
    except ScheduleError:
        schedule = schedules.build(name, ranks=p, microbatches=p * 3, chunks=chunks)
    check_against_oracle(schedule, random_costs(rng, schedule))


@pytest.mark.parametrize("seed", range(100))
def test_contention_matches_oracle(seed: int) -> None:
    rng = random.Random(20_000 + seed)
    schedule = random_schedule(rng) if seed % 2 else registered_schedule(rng)
    check_against_oracle(schedule, random_costs(rng, schedule, contention=True))


def spread_oracle(program, costs: CostModel):
    """The spread's result by the oracle: longest paths of every draw, with the factors drawn
    here as the costs module documents them (stratified: each position of a rank's stream
    takes the list's values j * len // draws over the draws, shuffled per position in order by
    random.Random seeded with what and rank; none for an empty list); the times and step
    overhead of the draw whose makespan plus step overhead is the median (lower median, ties by
    draw)."""
    n = costs.spread_draws

    def columns(what: str, spread, rank: int, count: int) -> list[list[float]]:
        rng = random.Random(f"bubblescope-{what}:{rank}")
        out = []
        for _ in range(count):
            column = [spread[j * len(spread) // n] for j in range(n)]
            rng.shuffle(column)
            out.append(column)
        return out

    def drawn(what: str, spread, draw: int):
        if not spread:
            return None
        return [[c[draw] for c in columns(what, spread, rank, len(stream))]
                for rank, stream in enumerate(program.streams)]

    draws = []
    for draw in range(n):
        factors = drawn("spread", costs.duration_spread, draw) or [[1.0] * len(s) for s in program.streams]
        if costs.rank_spread or costs.step_spread:  # per rank and draw: its own factor times the step's
            step = columns("step", costs.step_spread, 0, 1)[0][draw] if costs.step_spread else 1.0
            shared = [(columns("rank", costs.rank_spread, rank, 1)[0][draw] if costs.rank_spread else 1.0) * step
                      for rank in range(len(program.streams))]
            factors = [[f * shared[rank] for f in row] for rank, row in enumerate(factors)]
        times = critical_path(program, costs, factors, drawn("transfer", costs.transfer_spread, draw))
        factor = columns("overhead", costs.step_overhead_spread, 0, 1)[0][draw] if costs.step_overhead_spread else 1.0
        overhead = round(round(costs.step_overhead * NS) * factor)
        draws.append((max(end for _, end in times.values()) + overhead, draw, times, overhead))
    draws.sort(key=lambda x: x[:2])
    return draws[(len(draws) - 1) // 2][2:]


def test_spread_draws_are_stratified() -> None:
    """Over the draws every position takes each value of the list equally often (8 draws of a
    4-value list: each twice), the order differs between positions, and a rank's table is the
    same whenever it is asked for."""
    spread = (0.5, 0.9, 1.1, 1.5)
    table = spread_factors(spread, 8, 1, 5)
    assert len(table) == 8 and all(len(row) == 5 for row in table)
    for i in range(5):
        assert sorted(row[i] for row in table) == sorted(spread * 2)
    assert len({tuple(row[i] for row in table) for i in range(5)}) > 1
    assert spread_factors(spread, 8, 1, 5) == table != spread_factors(spread, 8, 2, 5)
    assert spread_factors((), 3, 0, 2) == [[1.0, 1.0]] * 3


@pytest.mark.parametrize("seed", range(30))
def test_spread_matches_oracle(seed: int) -> None:
    """With duration, transfer, rank, step and/or step overhead spreads, the engine's result is the
    oracle's median draw (by makespan plus the draw's step overhead), time for time."""
    rng = random.Random(30_000 + seed)
    schedule = random_schedule(rng) if seed % 2 else registered_schedule(rng)
    base = random_costs(rng, schedule, contention=bool(seed % 3))
    spread = tuple(rng.choice([0.5, 0.8, 1.0, 1.25, 1.7]) for _ in range(rng.randint(0, 6)))
    transfer = tuple(rng.choice([0.3, 1.0, 2.5]) for _ in range(rng.randint(0 if spread else 1, 4)))
    shared = tuple(rng.choice([0.9, 1.0, 1.6]) for _ in range(rng.randint(0, 3)))
    step = tuple(rng.choice([0.7, 1.0, 1.3]) for _ in range(rng.randint(0, 3)))
    # a step overhead of a few actions' length, so that its draws can reorder the makespans'
    overhead = tuple(rng.choice([0.0, 1.0, 4.0]) for _ in range(rng.randint(0, 3)))
    costs = dataclasses.replace(base, duration_spread=spread, transfer_spread=transfer, rank_spread=shared,
                                step_spread=step, step_overhead=rng.uniform(0.0, 3.0) * base.forward[0],
                                step_overhead_spread=overhead, spread_draws=rng.randint(1, 7))
    program = schedules.lower(schedule)
    expected, overhead = spread_oracle(program, costs)
    result = simulate(program, costs)
    got = {
        (int(r), int(i)): (round(s * NS), round(e * NS))
        for r, group in result.timeline.groupby("rank", sort=True)
        for i, (s, e) in enumerate(zip(group["start"], group["end"]))
    }
    assert got == expected
    assert result.makespan_ns == max(end for _, end in expected.values())
    assert result.overhead_ns == overhead


def test_spread_draws_differ_and_widen_the_makespan() -> None:
    """A spread of 0.5 and 1.5 (mean 1) around 1F1B's costs: the median draw's makespan exceeds
    the replay of the mean costs (a max over paths of noisy sums), and is reproducible."""
    schedule = schedules.build("1f1b", ranks=4, microbatches=16)
    base = CostModel(forward=1e-3, backward_full=2e-3)
    noisy = dataclasses.replace(base, duration_spread=(0.5, 1.5), spread_draws=9)
    plain, first, again = simulate(schedule, base), simulate(schedule, noisy), simulate(schedule, noisy)
    assert first.makespan_ns == again.makespan_ns
    assert first.makespan_ns > plain.makespan_ns


def test_random_generator_covers_adjacent_stages_on_one_rank() -> None:
    """The random placements include same-rank adjacent stages (in-memory handover, as on V)."""
    hits = 0
    for seed in range(250):
        s = random_schedule(random.Random(seed))
        hits += any(s.stage_to_rank[i] == s.stage_to_rank[i + 1] for i in range(s.num_stages - 1))
    assert hits > 50
