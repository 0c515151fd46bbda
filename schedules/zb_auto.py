"""zb-auto: zero-bubble orders built from profiled costs under an activation-memory limit.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Sec. 3.1: rather than a fixed
pattern, the order of F, I (their B) and W on each stage is built from the profiled T_F,
T_B, T_W, T_comm and a per-stage memory limit. This module holds the paper's heuristic
and a local search on top of it.

`heuristic` places passes one at a time and times each as it goes (a pass starts when
its rank is free and its input has arrived), in the order the paper's heuristic uses (as
its authors' scheduler, github.com/sail-sg/zero-bubble-pipeline-parallelism, runs it):

- warm-up: microbatch 0 goes down the ranks; then each rank runs as many extra forwards as
  fit in memory before the gradient of microbatch 0 comes back (timed back up the ranks),
  each rank fewer than the one before it unless that one has run them all; then the I
  passes of microbatch 0 go back up;
- then one round per microbatch i: a forward on each rank that has forwards left (a rank
  ahead of the next by two or more may skip it, `Policy.skip_forward`; a rank skips when
  the next one does), then the I passes of microbatch i from the last rank to the first;
- before each pass, owed W passes run while memory has no room for it, then while they
  end before its input arrives; into a remaining gap shorter than T_W one more W goes if
  idling would make this rank's accumulated bubble the largest (or always, with
  `Policy.fill_small_gaps`); once the first rank has no forward left it runs all its
  owed W passes before each I; the W passes left at the end close each rank's order.
  W passes run in the order of their I passes.

`plan` runs the heuristic over the paper's grid of three binary choices and keeps the
one with the shortest longest rank span (the paper's cost) unless `evaluate` is given
(sim.zb_search passes the simulator). Then it scores every grid point, the handcrafted
ZB-H1 and ZB-H2 orders when they fit the limit, and a local search over each rank's
warm-up depth (forwards before its first I, one more or one fewer), keeping only
improvements: the result is never worse, under `evaluate`, than the heuristic's best.
With the paper's profiled costs the heuristic alone gives its published ZB-1p and ZB-2p
bubble rates (README, bench/zb_auto_vs_paper.py).

Memory: limit K counts microbatches of one rank's share (K = p is 1F1B's peak, 2p
ZB-2p's). A forward of stage s adds `activation[s]` units when it starts, its I changes
them to `weight_memory[s]` units (what W needs) when it ends, its W frees those; no pass
is placed unless the rank's units stay within K after it, so the rank's peak never
exceeds K in the simulator's memory timeline, which counts the same way. The default
weight_memory = activation keeps a microbatch's whole footprint until W, so that K also
bounds a real executor's peak in units of one microbatch's largest footprint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from .errors import ScheduleError
from .ir import Action, Kind
from .placement import looped
from .registry import generator, register
from .schedule import Schedule

_EPS = 1e-9  # relative slack on memory comparisons (sums of fractional units)


@dataclass(frozen=True)
class AutoCosts:
    """What zb-auto plans with, one entry per stage (= rank): F, I and W times in any one
    unit, the time `p2p` of one transfer between neighbouring ranks in the same unit, and
    memory in units of one microbatch's activations of one rank's share: `activation[s]`
    held from F to I, `weight_memory[s]` from I to W (default: the activation)."""

    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    p2p: float = 0.0
    activation: tuple[float, ...] | None = None
    weight_memory: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        n = len(self.forward)
        if n < 1:
            raise ScheduleError("zb-auto costs need at least one stage")
        for name in ("forward", "backward_input", "backward_weight", "activation", "weight_memory"):
            value = getattr(self, name)
            if value is None:
                continue
            value = tuple(value)
            if len(value) != n:
                raise ScheduleError(f"zb-auto costs: {name} has {len(value)} entries, forward has {n}")
            for v in value:
                _check_number(name, v, positive=name in ("forward", "backward_input", "activation"))
            object.__setattr__(self, name, value)
        _check_number("p2p", self.p2p, positive=False)
        if self.activation is None:
            object.__setattr__(self, "activation", (1.0,) * n)
        if self.weight_memory is None:
            object.__setattr__(self, "weight_memory", self.activation)

    @property
    def stages(self) -> int:
        return len(self.forward)

    @classmethod
    def uniform(
        cls, stages: int, forward: float = 1.0, backward_input: float = 1.0, backward_weight: float = 1.0,
        p2p: float = 0.0, weight_memory: float = 1.0,
    ) -> "AutoCosts":
        """Equal stages; `weight_memory` is the share of a microbatch's activations W keeps."""
        return cls((forward,) * stages, (backward_input,) * stages, (backward_weight,) * stages, p2p,
                   (1.0,) * stages, (weight_memory,) * stages)

    def footprint(self, stage: int) -> float:
        """The most units one microbatch of `stage` holds at once (from its F to its W)."""
        return max(self.activation[stage], self.weight_memory[stage])


def _check_number(name: str, value, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
        raise ScheduleError(f"zb-auto costs: {name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ScheduleError(f"zb-auto costs: {name} must be {'> 0' if positive else '>= 0'}, got {value!r}")


@dataclass(frozen=True)
class Policy:
    """The heuristic's choices (the paper grid-searches the three flags).

    `bubble_before_first_i`: warm-up forwards stop once the next one would end after the
    first gradient arrives (a bubble shorter than T_F may remain), rather than once the
    rank's clock has reached the arrival (the last forward may delay the first I).
    `skip_forward`: a rank at least two forwards ahead of the next one may skip its forward
    in a round when it would not end before the next rank's gradient could come back.
    `fill_small_gaps`: a gap shorter than T_W before an input arrives is filled with a W
    even when idling would not make this rank's accumulated bubble the largest.
    `warmup`: forwards before each rank's first I (None: as the heuristic computes them);
    clipped to memory and to one fewer than the previous rank's.
    """

    bubble_before_first_i: bool = True
    skip_forward: bool = False
    fill_small_gaps: bool = True
    warmup: tuple[int, ...] | None = None


GRID = tuple(
    Policy(tight, skip, fill) for tight in (True, False) for skip in (True, False) for fill in (True, False)
)


@dataclass(frozen=True)
class Plan:
    """A built order with the heuristic's own estimate of it (None for other candidates)."""

    schedule: Schedule
    policy: Policy | None
    makespan: float | None = None
    spans: tuple[float, ...] | None = None


class _NoRoom(Exception):
    """The memory limit leaves no room for the next action and no W is owed to free some."""


class _Build:
    """One run of the heuristic: each rank's order and the times the order implies (every
    action starts once its rank is free and its input has arrived)."""

    def __init__(self, p: int, m: int, costs: AutoCosts, limit: float):
        self.p, self.m, self.costs, self.limit = p, m, costs, limit
        self.duration = {Kind.F: costs.forward, Kind.I: costs.backward_input, Kind.W: costs.backward_weight}
        self.count = {kind: [0] * p for kind in (Kind.F, Kind.I, Kind.W)}
        self.end = {kind: [[math.nan] * m for _ in range(p)] for kind in (Kind.F, Kind.I)}
        self.clock = [0.0] * p
        self.first = [math.nan] * p
        self.bubble = [0.0] * p  # idle time since the rank's first action
        self.held = [0.0] * p
        self.order: list[list[Action]] = [[] for _ in range(p)]

    def change(self, r: int, kind: Kind) -> float:
        """Units of memory `kind` adds on rank r (negative: frees)."""
        act, kept = self.costs.activation[r], self.costs.weight_memory[r]
        return {Kind.F: act, Kind.I: kept - act, Kind.W: -kept}[kind]

    def owed(self, r: int) -> int:
        return self.count[Kind.I][r] - self.count[Kind.W][r]

    def arrival(self, r: int, kind: Kind) -> float:
        """When the input of rank r's next `kind` is there (already placed on its neighbour)."""
        j, c = self.count[kind][r], self.costs.p2p
        if kind is Kind.F:
            return self.end[Kind.F][r - 1][j] + c if r > 0 else 0.0
        if kind is Kind.I and r < self.p - 1:
            return self.end[Kind.I][r + 1][j] + c
        return 0.0

    def put(self, r: int, kind: Kind) -> None:
        if self.held[r] + self.change(r, kind) > self.limit:
            raise _NoRoom
        j = self.count[kind][r]
        start = max(self.clock[r], self.arrival(r, kind))
        if math.isnan(self.first[r]):
            self.first[r] = start
        else:
            self.bubble[r] += start - self.clock[r]
        self.clock[r] = start + self.duration[kind][r]
        if kind in self.end:
            self.end[kind][r][j] = self.clock[r]
        self.count[kind][r] += 1
        self.held[r] += self.change(r, kind)
        self.order[r].append(Action(r, kind, j))

    def make_room(self, r: int, kind: Kind) -> None:
        """Run owed W passes until `kind` fits under the limit."""
        while self.held[r] + self.change(r, kind) > self.limit:
            if not self.owed(r):
                raise _NoRoom
            self.put(r, Kind.W)

    def fill_until(self, r: int, arrival: float, fill_small_gaps: bool) -> None:
        """Run owed W passes in the wait for an input arriving at `arrival`: each that ends by
        then, and one more into a shorter gap if idling it would make this rank's bubble the
        largest (or always, with fill_small_gaps)."""
        w = self.costs.backward_weight[r]
        while self.owed(r) and self.clock[r] + w <= arrival:
            self.put(r, Kind.W)
        gap = arrival - self.clock[r]
        if self.owed(r) and gap > 0 and (fill_small_gaps or gap > max(self.bubble) - self.bubble[r]):
            self.put(r, Kind.W)


def heuristic(ranks: int, microbatches: int, costs: AutoCosts, memory_limit: float,
              policy: Policy = Policy()) -> Plan:
    """The paper's heuristic (Sec. 3.1, as its authors' scheduler runs it) for one set of
    choices; raises ScheduleError if the limit leaves no room under these choices."""
    p, m = ranks, microbatches
    _check_sizes(p, m, costs, memory_limit)
    state = _Build(p, m, costs, memory_limit * (1 + _EPS) + _EPS)
    try:
        _warm_up(state, policy)
        for i in range(1, m):
            _round(state, policy, i)
        for r in range(p):
            while state.owed(r):
                state.put(r, Kind.W)
    except _NoRoom:
        raise ScheduleError(
            f"zb-auto: memory limit {memory_limit:g} leaves no room for the next pass under {policy}"
        ) from None
    schedule = Schedule("zb-auto", p, m, 1, looped(p, 1), tuple(tuple(row) for row in state.order))
    spans = tuple(state.clock[r] - state.first[r] for r in range(p))
    return Plan(schedule, policy, max(state.clock), spans)


def _warm_up(state: _Build, policy: Policy) -> None:
    """Microbatch 0 down the ranks, as many extra forwards per rank as fit (in memory and,
    per `bubble_before_first_i`, in time) before its gradient comes back, then its I
    passes back up. Each rank runs fewer extra forwards than the previous one, or as many
    when that one has run every forward (a forward never comes before its input's)."""
    p, m, costs = state.p, state.m, state.costs
    f, b, c = costs.forward, costs.backward_input, costs.p2p
    for r in range(p):
        state.put(r, Kind.F)
    extra = [0] * p
    gradient = state.clock[p - 1] + b[p - 1]  # I of microbatch 0 on the last rank ends
    # Room for the first I too, if it holds more than its forward did.
    reserve = [max(0.0, state.change(r, Kind.I)) for r in range(p)]
    for r in range(p - 2, -1, -1):
        clock, held, n = state.clock[r], state.held[r], 0
        while 1 + n < m and held + costs.activation[r] + reserve[r] <= state.limit:
            if policy.bubble_before_first_i and clock + f[r] > gradient + c:
                break
            if not policy.bubble_before_first_i and clock >= gradient + c:
                break
            clock, held, n = clock + f[r], held + costs.activation[r], n + 1
        extra[r] = n
        gradient = max(clock, gradient + c) + b[r]
    if policy.warmup is not None:
        room = [int((state.limit - state.held[r] - reserve[r]) // costs.activation[r]) for r in range(p)]
        extra = [max(0, min(policy.warmup[r] - 1, room[r], m - 1)) for r in range(p)]
    for r in range(1, p):  # fewer than the previous rank, unless it has run every forward
        extra[r] = min(extra[r], extra[r - 1] if 1 + extra[r - 1] >= m else max(extra[r - 1] - 1, 0))
    for r in range(p):
        for _ in range(extra[r]):
            state.put(r, Kind.F)
    for r in range(p - 1, -1, -1):
        state.make_room(r, Kind.I)
        state.put(r, Kind.I)


def _round(state: _Build, policy: Policy, i: int) -> None:
    """One forward per rank (unless skipped), then the I passes of microbatch i back up,
    W passes in the waits."""
    p, m = state.p, state.m
    forwards = state.count[Kind.F]
    wants = [forwards[r] < m for r in range(p)]
    if policy.skip_forward:
        for r in range(p - 1):
            if wants[r] and forwards[r] >= forwards[r + 1] + 2:
                wants[r] = not _skips_forward(state, r)
    for r in range(p - 2, -1, -1):
        wants[r] = wants[r] and wants[r + 1]
    for r in range(p):
        if wants[r]:
            state.make_room(r, Kind.F)
            if r > 0:
                state.fill_until(r, state.arrival(r, Kind.F), policy.fill_small_gaps)
            state.put(r, Kind.F)
    for r in range(p - 1, -1, -1):
        state.make_room(r, Kind.I)
        if r < p - 1:
            state.fill_until(r, state.arrival(r, Kind.I), policy.fill_small_gaps)
        if r == 0 and forwards[0] == m:  # the first rank has no forward left to wait behind
            while state.owed(0):
                state.put(0, Kind.W)
        state.put(r, Kind.I)


def _skips_forward(state: _Build, r: int) -> bool:
    """Whether rank r, ahead of rank r+1 by two forwards or more, skips its forward this
    round: when the forward (and the W passes it needs room from) would not end before
    rank r+1 could send a gradient back, and idling until then keeps rank r's bubble
    within the largest."""
    costs = state.costs
    gradient = state.clock[r + 1] + costs.forward[r + 1] + costs.backward_input[r + 1] + costs.p2p
    if state.clock[r] >= gradient:
        return True
    held, extra, owed = state.held[r] + state.change(r, Kind.F), 0.0, state.owed(r)
    while held > state.limit and owed:
        held, extra, owed = held - costs.weight_memory[r], extra + costs.backward_weight[r], owed - 1
    if state.clock[r] + costs.forward[r] + extra <= gradient:
        return False
    return gradient - state.clock[r] <= max(state.bubble) - state.bubble[r]


def _check_sizes(p: int, m: int, costs: AutoCosts, memory_limit: float) -> None:
    if costs.stages != p:
        raise ScheduleError(f"zb-auto: costs give {costs.stages} stage(s), the schedule has {p} ranks")
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)) or math.isnan(memory_limit):
        raise ScheduleError(f"zb-auto: memory limit must be a number, got {memory_limit!r}")
    least = max(costs.footprint(s) for s in range(p))
    if memory_limit < least * (1 - _EPS):
        raise ScheduleError(
            f"zb-auto: memory limit {memory_limit:g} is below one microbatch's activations ({least:g} units)"
        )


def peak_memory(schedule: Schedule, costs: AutoCosts) -> list[float]:
    """Per rank, the most units held at once under `costs` (the accounting of the module docstring)."""
    peaks = []
    for r, row in enumerate(schedule.order):
        held = peak = 0.0
        for a in row:
            if a.kind is Kind.F:
                held += costs.activation[a.stage]
            elif a.kind is Kind.I:
                held += costs.weight_memory[a.stage] - costs.activation[a.stage]
            elif a.kind is Kind.W:
                held -= costs.weight_memory[a.stage]
            elif a.kind is Kind.B:
                held -= costs.activation[a.stage]
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def plan(
    ranks: int,
    microbatches: int,
    costs: AutoCosts,
    memory_limit: float,
    evaluate: Callable[[Schedule], float] | None = None,
    max_evaluations: int = 200,
) -> Plan:
    """The best order found (module docstring); `evaluate` scores a schedule, lower is better.

    The grid and the handcrafted orders are always scored; the local search then runs while
    fewer than `max_evaluations` schedules have been scored in all.
    """
    p, m = ranks, microbatches
    _check_sizes(p, m, costs, memory_limit)
    grid = []
    for policy in GRID:
        try:
            grid.append(heuristic(p, m, costs, memory_limit, policy))
        except ScheduleError:
            continue
    if not grid:
        raise ScheduleError(f"zb-auto: memory limit {memory_limit:g} leaves no room under any of the heuristic's choices")
    if evaluate is None:
        return min(grid, key=lambda c: (max(c.spans), c.makespan))
    scores: dict[tuple, float] = {}
    budget = [max_evaluations]

    def score(candidate: Plan) -> float:
        key = candidate.schedule.order
        if key not in scores:
            budget[0] -= 1
            scores[key] = evaluate(candidate.schedule)
        return scores[key]

    best = min(grid, key=score)
    best_score = score(best)
    for name in ("zb-h1", "zb-h2"):
        hand = _handcrafted(name, p, m, costs, memory_limit)
        if hand is not None and score(hand) < best_score:
            best, best_score = hand, score(hand)
    if best.policy is None:
        return best
    # Local search over the warm-up depth of each rank: try the moves in turn, keep each
    # improvement and go on from the next move, until a whole round of moves changes
    # nothing or the evaluations run out.
    current = replace(best.policy, warmup=tuple(_warmups(best.schedule)))
    since = 0  # moves tried since the last improvement
    k = 0
    while budget[0] > 0:
        moves = _moves(current)
        if since >= len(moves):
            break
        move = moves[k % len(moves)]
        k, since = k + 1, since + 1
        try:
            candidate = heuristic(p, m, costs, memory_limit, move)
        except ScheduleError:
            continue
        if score(candidate) < best_score:
            best, best_score, current, since = candidate, score(candidate), move, 0
    return best


def _warmups(schedule: Schedule) -> list[int]:
    """Per rank, the forwards run before its first I."""
    out = []
    for row in schedule.order:
        first_i = next(k for k, a in enumerate(row) if a.kind is Kind.I)
        out.append(sum(1 for a in row[:first_i] if a.kind is Kind.F))
    return out


def _moves(policy: Policy) -> list[Policy]:
    """One rank's warm-up one forward shorter or longer."""
    out = []
    for r, depth in enumerate(policy.warmup):
        for step in (-1, 1):
            if depth + step >= 1:
                out.append(replace(policy, warmup=policy.warmup[:r] + (depth + step,) + policy.warmup[r + 1:]))
    return out


def _handcrafted(name: str, p: int, m: int, costs: AutoCosts, memory_limit: float) -> Plan | None:
    """ZB-H1 or ZB-H2 as a candidate, renamed, if it fits the memory limit."""
    order = generator(name).make(p, m, 1).order
    schedule = Schedule("zb-auto", p, m, 1, looped(p, 1), order)
    if max(peak_memory(schedule, costs)) > memory_limit * (1 + _EPS) + _EPS:
        return None
    return Plan(schedule, None)


@register("zb-auto", "zero bubble, automatic (Qi et al. 2024, Sec. 3): built from costs under a memory limit")
def zb_auto(
    ranks: int,
    microbatches: int,
    chunks: int = 1,
    costs: AutoCosts | None = None,
    memory_limit: float | None = None,
    evaluate: Callable[[Schedule], float] | None = None,
    max_evaluations: int = 200,
) -> Schedule:
    """Defaults: equal unit costs (T_F = T_B = T_W, no transfer time) and 1F1B's memory (K = p)."""
    costs = AutoCosts.uniform(ranks) if costs is None else costs
    if not isinstance(costs, AutoCosts):
        raise ScheduleError(f"zb-auto: costs must be schedules.zb_auto.AutoCosts, got {type(costs).__name__}")
    limit = float(ranks) if memory_limit is None else memory_limit
    return plan(ranks, microbatches, costs, limit, evaluate, max_evaluations).schedule

