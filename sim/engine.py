"""The discrete-event engine: one SimPy process per rank walks its lowered stream.

Semantics (times are integer nanoseconds, so results are exact and deterministic):

- compute (F, B, I, W) occupies its rank for the action's cost; a rank runs one action
  at a time in stream order, so its compute resource is the process itself;
- a SEND never blocks its rank: it puts the tensor on the directed link rank -> peer,
  where it arrives ``latency + bytes / bandwidth`` later. With link contention a link
  carries one transfer at a time, first come first served in issue order, so a
  transfer starts when both the SEND is issued and the previous transfer on the link
  has arrived;
- a RECV blocks its rank until the matching transfer has arrived;
- a REDUCE_GRAD (data parallelism) never blocks its rank: its all-reduce (sim.costs) runs
  on the rank's collective resource, which carries one at a time in stream order, from
  when both the rank has reached it and the previous one has ended; the step's makespan
  includes its end;
- executor overheads (0 by default): a SEND occupies its rank for ``send_overhead``
  after putting the tensor on the link, ``wake_overhead`` more where ranks share cores
  (``cores``), its receiver reached the RECV strictly before the SEND was issued and the
  ranks computing then, with the sender, fill the cores (the woken receiver takes the
  sender's), a RECV ends no earlier than ``recv_overhead``
  after the rank reached it, and a compute action that does not repeat the stage and
  kind of its rank's previous compute action costs ``switch_forward`` (F) or
  ``switch_backward`` (B, I, W) more, and the k-th action of a run of repeats costs its
  stage cost times ``repeat_factor`` (sim.costs: ``repeat_discount_forward`` /
  ``repeat_discount_backward``, caches warm over several repeats); the first actions of a
  stage and kind in a step (schedules.analysis.places) cost their stage cost times their ``place_factors``;
  an F whose backward is split (schedules.analysis.split_forwards) has ``forward_split`` for its stage cost;
  a rank starts its stream ``post_overhead`` times the receives it posts before its first
  action later (``post_ahead``, schedules.posting.posted_first; every receive of its step
  with whole-step posting), holding its rank but no shared processor, as a SEND's overhead.
  With ``compute_growth`` (sim.costs) a compute action's time, all of that (and its spread's
  draw) included, is times ``growth_factor`` of the simulated time it starts at, rounded to the
  nanosecond: the engine prices it when it starts.

With ``cores`` (sim.costs; one host's CPU executor running more ranks than it has cores) the
ranks' compute shares that many processors: while k actions compute, each advances at
min(1, cores / k) of its speed (processor sharing; class Processors). Ranks waiting in a RECV
take no processor, or ``idle_share`` of one (sim.costs): each then advances at
min(1, cores / (k + idle_share x (R - k))) with R ranks.

With ``p2p_load_latency`` (sim.costs) a transfer is slower while ranks compute: it advances at
1 / (t + load x k) of its whole per nanosecond, t its time on an idle machine and k the ranks
computing at that moment (class Wire), so that under a constant k it takes t + load x k. Its
arrival is then known only when it ends; link contention still starts a link's next transfer
when the previous one has arrived.

With a duration spread (sim.costs) the program is replayed once per draw, each compute
action's time (switch cost included) multiplied by its factor of the draw
(`spread_factors`, stratified over the draws) and rounded to the nanosecond (times the
rank's factor of the draw with a rank spread, itself times the draw's step factor, which all
ranks share, with a step spread; likewise each SEND's transfer time with a transfer
spread, and the step overhead with a step overhead spread), and the draw whose makespan plus
step overhead is the median is the result.

Activation memory of a stage is allocated when its F starts and freed when its B ends
(with split backward: I frees what W does not keep when it ends, or allocates what W keeps
beyond F's bytes when it starts; W frees the rest when it ends; see sim.costs), less what
two stages on one rank share (sim.handover).

After the run every process must have reached the end of its stream; a rank that
did not waits on a RECV whose SEND never happens, and ScheduleError names them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import math

import simpy

from schedules import Action, Kind, Program, Schedule, ScheduleError, lower
from schedules.analysis import places, run_lengths, split_forwards
from schedules.ir import Direction, transfer_count
from schedules.posting import posted_first

from .costs import CostModel, ResolvedCosts, growth_factor, processor_share, repeat_factor, spread_factors
from .handover import adjustments
from .result import RankRecord, SimResult

# Opcodes of the compiled streams (plain ints keep the hot loop cheap).
_COMPUTE, _SEND, _RECV, _REDUCE = 0, 1, 2, 3


@dataclass(frozen=True)
class Compiled:
    """A program flattened for the hot loop: one op tuple per action, per rank.

    Compute: (_COMPUTE, duration, bytes allocated at start, bytes freed at end);
    SEND: (_SEND, transfer id, duration, link id, factor): factor is the transfer spread's
    draw, by which a load-dependent transfer's load term grows as its duration did; RECV:
    (_RECV, transfer id);
    REDUCE_GRAD: (_REDUCE, duration).
    Transfer ids are the IR's dense numbers (`Transfer.number`), so a SEND and its RECV
    share one; link ids are sender rank * p + receiver rank.
    """

    ops: tuple[tuple[tuple[int, ...], ...], ...]
    num_transfers: int
    num_links: int
    begins: tuple[int, ...] = ()  # per rank: ns before its first action (receives it posts first); () all 0


def simulate(schedule_or_program: Schedule | Program, costs: CostModel) -> SimResult:
    """Replay a schedule (lowered and validated here) or a lowered Program under `costs`.

    A Program is replayed as given, without validation, so that hand-built programs
    can be studied; if it cannot finish, ScheduleError names every stuck rank.
    """
    if isinstance(schedule_or_program, Schedule):
        program = lower(schedule_or_program)
    elif isinstance(schedule_or_program, Program):
        program = schedule_or_program
    else:
        raise TypeError(f"simulate() takes a Schedule or a Program, not {type(schedule_or_program).__name__}")
    resolved = costs.for_schedule(program.schedule)
    compiled = compile_program(program, resolved)
    drawn: tuple[int, ...] = ()
    if resolved.drawn:
        records, overhead, drawn = median_draw(compiled, resolved)
    else:
        records = replay(compiled, resolved.contention, resolved.send_overhead, resolved.recv_overhead,
                         resolved.cores, resolved.transfer_load, resolved.idle_share, resolved.growth,
                         resolved.growth_horizon, resolved.wake_overhead)
        overhead = resolved.step_overhead
    _check_finished(program, records)
    return SimResult.from_records(program, costs, resolved, records, overhead, drawn)


def compute_seconds(program: Program, costs: CostModel) -> float:
    """The program's compute time for one step under `costs`, summed over ranks: every compute
    action's typical time (switch and place included, no spread, each on a processor of its
    own; where compute grows into the step, at the start a replay without spread gives it),
    seconds."""
    resolved = costs.for_schedule(program.schedule)
    compiled = compile_program(program, resolved)
    if resolved.growth:
        records = replay(compiled, resolved.contention, resolved.send_overhead, resolved.recv_overhead,
                         resolved.cores, resolved.transfer_load, resolved.idle_share, resolved.growth,
                         resolved.growth_horizon, resolved.wake_overhead)
        return sum(r.work for r in records) / 1e9
    return sum(op[1] for row in compiled.ops for op in row if op[0] == _COMPUTE) / 1e9


def compile_program(program: Program, costs: ResolvedCosts) -> Compiled:
    """Turn every action into an op tuple (compute ops are shared per stage and kind)."""
    schedule = program.schedule
    s2r = schedule.stage_to_rank
    p, m, n = schedule.ranks, schedule.microbatches, schedule.num_stages
    zero = [0] * n
    kept = costs.weight_memory
    forward, backward = costs.repeat_discount_forward, costs.repeat_discount_backward  # F; B, I and W
    columns = {
        Kind.F: (costs.forward, costs.switch_forward, forward, costs.memory, zero),
        Kind.B: (costs.backward, costs.switch_backward, backward, zero, costs.memory),
        # I frees what W does not need, or allocates what W needs beyond F's activations (the
        # output gradients a split backward keeps: sim.costs).
        Kind.I: (costs.input, costs.switch_backward, backward, [max(k - m, 0) for m, k in zip(costs.memory, kept)],
                 [max(m - k, 0) for m, k in zip(costs.memory, kept)]),
        Kind.W: (costs.weight, costs.switch_backward, backward, zero, kept),
    }
    placed = dict(costs.place_factors)  # kind -> factors of a stage's first actions of that kind in a step
    discounted = {kind for kind, column in columns.items() if column[2]}
    # (kind, stage, run length, split) -> op of a later place (with a discount, run lengths up to m)
    later: dict[tuple[Kind, int, int, bool], tuple[int, ...]] = {}

    def compute_op(kind: Kind, stage: int, place: int, length: int, split: bool) -> tuple[int, ...]:
        """The op of a compute action (place: schedules.analysis.places; length:
        schedules.analysis.run_lengths; split: schedules.analysis.split_forwards)."""
        durations, switch, discount, alloc, free = columns[kind]
        if split:
            durations = costs.forward_split
        factors = placed.get(kind, ())
        scale = (factors[place] if place < len(factors) else 1.0) * repeat_factor(discount, length)
        base = durations[stage] if scale == 1.0 else round(durations[stage] * scale)
        return (_COMPUTE, base + (switch if length == 1 else 0), alloc[stage], free[stage])

    durations = {Direction.FORWARD: costs.send_forward, Direction.BACKWARD: costs.send_backward}
    # What a SEND/RECV compiles to depends on its stage and kind, and its microbatch only
    # through the transfer number (Transfer.number: microbatch 0's plus the microbatch).
    comm: dict[tuple[int, Kind], tuple[bool, int, int, int] | None] = {}
    ops = []
    for rank, stream in enumerate(program.streams):
        row = []
        append = row.append
        for action, length, place, split in zip(stream, run_lengths(stream), places(stream), split_forwards(stream)):
            kind, stage, mb = action.kind, action.stage, action.microbatch
            if kind is Kind.REDUCE_GRAD and 0 <= stage < n:
                append((_REDUCE, costs.reduce_grad[stage]))
                continue
            if not (0 <= stage < n and 0 <= mb < m):
                raise ScheduleError(
                    f"rank {rank}: {action} is outside stages 0..{n - 1} or microbatches 0..{m - 1}"
                )
            if kind in columns:
                factors = placed.get(kind)
                if factors is not None and place < len(factors):
                    append(compute_op(kind, stage, place, length, split))
                else:
                    if length > 2 and kind not in discounted:
                        length = 2  # without a discount every repeat costs the same: one op
                    key = (kind, stage, length, split)
                    op = later.get(key)
                    if op is None:
                        op = later[key] = compute_op(kind, stage, place, length, split)
                    append(op)
                continue
            key = (stage, kind)
            if key not in comm:
                transfer = Action(stage, kind, 0).transfer
                ends = (transfer.sender, transfer.receiver)
                comm[key] = None if not all(0 <= s < n for s in ends) else (
                    kind.is_send, transfer.number(m), durations[transfer.direction][transfer.boundary],
                    s2r[transfer.receiver],
                )
            compiled = comm[key]
            if compiled is None:
                raise ScheduleError(f"rank {rank}: {action} has no peer stage (stages are 0..{n - 1})")
            is_send, first, duration, receiver_rank = compiled
            if is_send:
                append((_SEND, first + mb, duration, rank * p + receiver_rank, 1.0))
            else:
                append((_RECV, first + mb))
        for i, extra in adjustments(stream, costs.handover).items():
            code, duration, alloc, free = row[i]
            net = alloc - free + extra
            row[i] = (code, duration, max(net, 0), max(-net, 0))
        ops.append(tuple(row))
    begins = ()
    if costs.post_overhead:
        begins = tuple(costs.post_overhead * posted_first(stream, costs.post_ahead) for stream in program.streams)
    return Compiled(tuple(ops), transfer_count(n, m), p * p, begins)


SpreadTables = list[tuple[list[list[float]], list[list[float]], list[float]]]


def spread_tables(compiled: Compiled, costs: ResolvedCosts) -> SpreadTables:
    """Per rank, the compute and transfer factors of every draw and the factor its whole
    compute takes in each draw: the rank's own times the step's, which all ranks share
    (sim.costs.spread_factors)."""
    n = costs.draws
    step = [row[0] for row in spread_factors(costs.step_spread, n, 0, 1, "step")]
    return [(spread_factors(costs.spread, n, rank, len(row)),
             spread_factors(costs.transfer_spread, n, rank, len(row), "transfer"),
             [own[0] * shared for own, shared in zip(spread_factors(costs.rank_spread, n, rank, 1, "rank"), step)])
            for rank, row in enumerate(compiled.ops)]


def spread_draw(compiled: Compiled, tables: SpreadTables, draw: int) -> Compiled:
    """`compiled` with each compute op's time and each SEND's transfer time scaled by its
    factor of draw `draw` (`spread_tables`)."""
    ops = []
    for row, (compute, transfer, shared) in zip(compiled.ops, tables):
        k = shared[draw]
        ops.append(tuple(
            (_COMPUTE, round(op[1] * (f * k)), op[2], op[3]) if op[0] == _COMPUTE
            else (_SEND, op[1], round(op[2] * t), op[3], t) if op[0] == _SEND else op
            for op, f, t in zip(row, compute[draw], transfer[draw])
        ))
    return replace(compiled, ops=tuple(ops))  # the other terms (posting starts, counts) as compiled


def draw_overheads(costs: ResolvedCosts) -> list[int]:
    """The step overhead of every draw, ns: ``step_overhead`` times its factor of the draw
    (sim.costs.spread_factors, "overhead")."""
    return [round(costs.step_overhead * row[0])
            for row in spread_factors(costs.overhead_spread, costs.draws, 0, 1, "overhead")]


def median_draw(compiled: Compiled, costs: ResolvedCosts) -> tuple[list[RankRecord], int, tuple[int, ...]]:
    """Replay every draw of the spread; the records and step overhead of the draw whose
    makespan plus step overhead is the median (lower median, ties by draw number), replayed
    again rather than kept: only its step time is held for each draw; and every draw's step
    time (ns, ascending)."""
    tables = spread_tables(compiled, costs)
    overheads = draw_overheads(costs)

    def run(draw: int) -> list[RankRecord]:
        return replay(spread_draw(compiled, tables, draw), costs.contention, costs.send_overhead,
                      costs.recv_overhead, costs.cores, costs.transfer_load, costs.idle_share, costs.growth,
                      costs.growth_horizon, costs.wake_overhead)

    steps = sorted((makespan_ns(run(draw)) + overheads[draw], draw) for draw in range(costs.draws))
    chosen = steps[(len(steps) - 1) // 2][1]
    return run(chosen), overheads[chosen], tuple(step for step, _ in steps)


def makespan_ns(records: list[RankRecord]) -> int:
    """When the last rank's process ended (ns; its final event, a reduction included)."""
    return max((r.times[-1] for r in records if r.times), default=0)


def replay(compiled: Compiled, contention: bool, send_overhead: int = 0, recv_overhead: int = 0,
           cores: int = 0, load: int = 0, idle: float = 0.0, growth: float = 0.0,
           horizon: int = 0, wake: int = 0) -> list[RankRecord]:
    """Replay compiled streams in the SimPy model; returns what each rank's process recorded
    (overheads in ns; `cores` > 0: the ranks' compute shares that many processors, ranks not
    computing taking `idle` of one each; `load` > 0:
    ns a transfer takes longer per rank computing while it is on the wire, class Wire;
    `growth` per ns and `horizon` ns: a compute action costs sim.costs.growth_factor of its
    compiled duration at the time it starts; `wake` ns: more rank time per SEND whose receiver
    reached its RECV strictly earlier while the computing ranks and the sender fill the shared
    cores)."""
    env = simpy.Environment()
    arrivals = [-1] * compiled.num_transfers  # arrival time of each transfer, -1 until sent
    reached = [-1] * compiled.num_transfers  # when its receiver reached its RECV, -1 until then
    waiters: dict[int, simpy.Event] = {}  # transfer id -> event of the rank blocked on it
    link_free = [0] * compiled.num_links  # time each directed link finishes its last transfer
    records = [RankRecord() for _ in compiled.ops]
    shared = Processors(env, cores, len(compiled.ops), idle) if 0 < cores < len(compiled.ops) else None
    wire = Wire(env, load, compiled.num_links, contention, arrivals, waiters) if load > 0 else None
    begins = compiled.begins or (0,) * len(compiled.ops)
    for ops, out, begin in zip(compiled.ops, records, begins):
        env.process(
            _rank_process(env, ops, arrivals, reached, waiters, link_free, contention, send_overhead, recv_overhead,
                          out, shared, wire, begin, growth, horizon, wake)
        )
    env.run()
    return records


class Processors:
    """`cores` processors shared by `ranks` ranks' compute (processor sharing, as an operating
    system's time slices do on average): while k actions compute, each advances at
    min(1, cores / (k + idle x (ranks - k))) of its own speed, `idle` the share of a core a rank
    not computing takes (0: processor sharing among compute alone). An action's work is its
    cost in ns at full speed; completions are rounded up to whole nanoseconds, so times stay
    integers."""

    def __init__(self, env: simpy.Environment, cores: int, ranks: int = 0, idle: float = 0.0) -> None:
        self.env, self.cores, self.ranks, self.idle = env, cores, ranks, idle
        self.jobs: dict[int, list] = {}  # job number -> [work left (ns at full speed), event]
        self.count = 0
        self.since = 0  # when the work left was last brought up to date
        self.version = 0  # bumps at each change, so a wake-up planned before it is ignored

    def run(self, work: int) -> simpy.Event:
        """An event that fires when `work` ns of full-speed compute is done."""
        self._advance()
        event = self.env.event()
        self.jobs[self.count] = [float(work), event]
        self.count += 1
        self._plan()
        return event

    def _rate(self) -> float:
        return processor_share(len(self.jobs), self.cores, self.ranks, self.idle)

    def _advance(self) -> None:
        now = self.env.now
        if self.jobs and now > self.since:
            done = (now - self.since) * self._rate()
            for job in self.jobs.values():
                job[0] -= done
        self.since = now

    def _plan(self) -> None:
        self.version += 1
        if self.jobs:
            least = min(job[0] for job in self.jobs.values())
            self.env.process(self._wake(self.version, max(math.ceil(least / self._rate() - 1e-9), 0)))

    def _wake(self, version: int, delay: int):
        yield self.env.timeout(delay)
        if version != self.version:
            return
        self._advance()
        for number in [n for n, job in self.jobs.items() if job[0] <= 1e-6]:
            self.jobs.pop(number)[1].succeed()
        self._plan()


@dataclass(slots=True)
class Flight:
    """A transfer on the wire (class Wire): the share of it left, its idle time t (ns, spread
    included), its spread factor f, its link, and where its SEND row's start and end go."""

    left: float
    time: int
    factor: float
    link: int
    record: list[int] = field(repr=False)
    index: int  # record[index - 1] is the row's start, record[index] its arrival


class Wire:
    """Transfers whose time grows with the ranks computing while they are on the wire: transfer
    i advances at 1 / (t_i + f_i x load x k) of its whole per ns, t_i its time on an idle
    machine (its SEND op's duration, spread factor f_i included), k the ranks computing at that
    moment. On a CPU host the ranks' compute and the transfers' threads share the cores; a
    transfer sent while every core computes waits for one. With link contention a link's
    transfers go one at a time in issue order, each starting when the previous has arrived.
    Completions are rounded up to whole nanoseconds, so times stay integers."""

    def __init__(self, env: simpy.Environment, load: int, links: int, contention: bool, arrivals: list[int],
                 waiters: dict[int, simpy.Event]) -> None:
        self.env, self.load, self.contention = env, load, contention
        self.arrivals, self.waiters = arrivals, waiters
        self.computing = 0
        self.flights: dict[int, Flight] = {}  # transfer id -> its flight
        self.queued: list[list[tuple[int, Flight]]] = [[] for _ in range(links)]  # per link: those behind it
        self.busy = [False] * links
        self.since = 0
        self.version = 0

    def send(self, tid: int, duration: int, factor: float, link: int, record: list[int], index: int) -> None:
        """Put transfer `tid` on `link` (behind the link's earlier ones with contention); its
        start and arrival are written to `record[index - 1]` and `record[index]`."""
        flight = Flight(1.0, duration, factor, link, record, index)
        if self.contention and self.busy[link]:
            self.queued[link].append((tid, flight))
            return
        self._advance()
        self._start(tid, flight)
        self._plan()

    def compute(self, change: int) -> None:
        """A rank starts (+1) or ends (-1) a compute action."""
        self._advance()
        self.computing += change
        self._plan()

    def _start(self, tid: int, flight: Flight) -> None:
        self.busy[flight.link] = True
        self.flights[tid] = flight
        flight.record[flight.index - 1] = self.env.now  # the SEND row starts when its transfer does

    def _time(self, flight: Flight) -> float:
        """ns the whole of `flight` takes at the present load."""
        return flight.time + flight.factor * self.load * self.computing

    def _advance(self) -> None:
        now = self.env.now
        if now > self.since:
            for flight in self.flights.values():
                time = self._time(flight)
                flight.left = flight.left - (now - self.since) / time if time > 0 else 0.0
        self.since = now

    def _plan(self) -> None:
        self.version += 1
        if self.flights:
            least = min(flight.left * self._time(flight) for flight in self.flights.values())
            self.env.process(self._wake(self.version, max(math.ceil(least - 1e-6), 0)))

    def _wake(self, version: int, delay: int):
        yield self.env.timeout(delay)
        if version != self.version:
            return
        self._advance()
        now = self.env.now
        for tid in [t for t, flight in self.flights.items() if flight.left * self._time(flight) <= 1e-6]:
            flight = self.flights.pop(tid)
            flight.record[flight.index] = now
            self.arrivals[tid] = now
            waiter = self.waiters.pop(tid, None)
            if waiter is not None:
                waiter.succeed()
            self.busy[flight.link] = False
            if self.queued[flight.link]:
                self._start(*self.queued[flight.link].pop(0))
        self._plan()


def _rank_process(env, ops, arrivals, reached, waiters, link_free, contention, send_overhead, recv_overhead,
                  out: RankRecord, shared: "Processors | None" = None, wire: "Wire | None" = None, begin: int = 0,
                  growth: float = 0.0, horizon: int = 0, wake: int = 0):
    """Walk one rank's ops from `begin` ns on, recording into `out` as it goes (compute on
    `shared` processors when given, else on the rank's own; transfers on `wire` when given; a
    compute action's duration times growth_factor(growth, horizon, its start); `reached`: when
    each transfer's receiver reached its RECV, -1 before, shared by the ranks, so that a SEND
    whose receiver waits while the ranks computing on `shared` and the sender fill its
    processors costs `wake` ns more)."""
    timeout = env.timeout
    record = out.times.append
    memory = out.memory
    now = held = peak = busy = work = 0
    if begin:
        yield timeout(begin)
        now = begin
    collective_free = 0  # when the rank's collective resource has ended its last reduction
    first = -1
    last = 0
    for op in ops:
        code = op[0]
        if code == _COMPUTE:
            _, duration, alloc, free = op
            if alloc:
                held += alloc
                memory.append((now, held))
                if held > peak:
                    peak = held
            start = now
            if growth and duration:
                duration = round(duration * growth_factor(growth, horizon, now))
                work += duration  # compute_seconds reads it only where compute grows
            if duration:
                # Zero-cost actions skip the event: times are max-plus in the inputs,
                # so the order of same-time events cannot change any result.
                if wire is not None:
                    wire.compute(+1)
                if shared is None:
                    yield timeout(duration)
                    now += duration
                else:
                    yield shared.run(duration)
                    now = env.now
                if wire is not None:
                    wire.compute(-1)
            if first < 0:
                first = start
            record(start)
            record(now)
            busy += now - start
            last = now
            if free:
                held -= free
                memory.append((now, held))
        elif code == _SEND:
            _, tid, duration, link, factor = op
            woke = (wake and shared is not None and 0 <= reached[tid] < now
                    and len(shared.jobs) + 1 >= shared.cores)
            if wire is not None:
                record(now)
                record(-1)  # the arrival, written by the wire
                wire.send(tid, duration, factor, link, out.times, len(out.times) - 1)
            else:
                start = now
                if contention:
                    busy_until = link_free[link]
                    if busy_until > start:
                        start = busy_until
                    link_free[link] = start + duration
                arrivals[tid] = start + duration
                waiter = waiters.pop(tid, None)
                if waiter is not None:
                    waiter.succeed()
                record(start)
                record(start + duration)
            cost = send_overhead + (wake if woke else 0)
            if cost:
                yield timeout(cost)
                now += cost
        elif code == _REDUCE:
            start = max(now, collective_free)
            collective_free = start + op[1]
            record(start)
            record(collective_free)
        else:
            tid = op[1]
            reach = reached[tid] = now
            arrival = arrivals[tid]
            if arrival < 0:
                event = env.event()
                waiters[tid] = event
                yield event
                now = env.now
                arrival = arrivals[tid]
            done = max(arrival, reach + recv_overhead)
            if done > now:
                yield timeout(done - now)
                now = done
            record(reach)
            record(now)
    out.busy, out.first, out.last, out.peak, out.work = busy, first, last, peak, work


def _check_finished(program: Program, records: list[RankRecord]) -> None:
    """Raise ScheduleError naming every rank that stopped before the end of its stream."""
    streams = program.streams
    s2r = program.schedule.stage_to_rank
    position = [len(r.times) // 2 for r in records]
    stuck = [r for r, s in enumerate(streams) if position[r] < len(s)]
    if not stuck:
        return
    sends = {a.transfer: (r, i) for r, s in enumerate(streams) for i, a in enumerate(s) if a.kind.is_send}
    lines = []
    for rank in stuck:
        action = streams[rank][position[rank]]
        transfer = action.transfer
        send = transfer.send()
        if transfer in sends:
            peer, index = sends[transfer]
            if position[peer] <= index:
                source = f"from rank {peer} (stuck at {streams[peer][position[peer]]})"
            else:  # only a hand-built program that receives one transfer twice gets here
                source = f"from rank {peer}, which sent it once, to another RECV of it"
        else:
            owner = f"rank {s2r[transfer.sender]}" if 0 <= transfer.sender < len(s2r) else "no rank"
            source = f"which no stream contains (stage {transfer.sender} sits on {owner})"
        lines.append(
            f"rank {rank} waits at {action} (action {position[rank]} of {len(streams[rank])}) for {send} {source}"
        )
    raise ScheduleError(f"[deadlock] {len(stuck)} of {len(streams)} ranks cannot finish: " + "; ".join(lines))
