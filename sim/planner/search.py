"""The search: enumerate legal configurations, discard what cannot fit, simulate the rest, rank.

Order of work, cheapest first:

1. `config.enumerate_configs` lists every configuration the closed-form rules allow and
   `stage_costs` prices each (arithmetic only).
2. **Static memory pruning**: a configuration whose model states and buffers plus one
   microbatch of its largest stage's activations exceed the cap on some rank cannot fit under
   any schedule (every stage allocates a microbatch at its first forward), so it is dropped
   before any program is built.
3. **Bound pruning**: every configuration gets a provable lower bound on its step time (below)
   and they are visited in increasing bound order. Once K configurations are ranked and the
   next bound exceeds the K-th step time, no remaining configuration can enter the top K: the
   top K is the same as simulating everything (a test checks this against brute force).
4. For a visited configuration the program of its shape (schedule, p, m, v) is built once
   and kept (programs.ProgramCache); its **exact activation peak** per rank comes from the
   program order (programs.activation_peaks, equal to the engine's memory timeline peak); if
   it does not fit it is dropped, else it is **simulated** (sim.engine). Configurations with
   the same shape and the same integer stage costs (e.g. differing only in ZeRO 0 vs 1, or in
   sequence parallelism) share one simulation.

**Lower bound** (integer nanoseconds, the engine's own rounding): a rank cannot start before
the first microbatch has gone through the stages below its lowest stage (their forwards and
the transfers between ranks), and then computes for its whole busy time (m x its stages' F +
B, or F + I + W), so its last compute ends at least at head + busy. After a rank's last
backward (B) of its lowest stage, that microbatch's backward still runs through every stage
below (their B and transfers: the tail). With split backward the rank's last I ends at least
at head + busy - (its W time), followed by the I's below. A step lasts at least until every
rank's last compute plus its data-parallel work (stage_costs), and until the pipeline's
tail. Executor overheads of a calibration (switch costs, send/receive overheads) only add time.

Ranking: step time, then peak memory per GPU, then `Config.key()`.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import schedules
from schedules.timeline import bubble_ratio
from sim.calibration import Calibration
from sim.engine import compile_program, makespan_ns, replay
from sim.costs import CostError

from .axes import AXES
from .cluster import Cluster
from .config import Config, Space, enumerate_configs
from .errors import PlanError
from .models import Transformer
from .programs import ProgramCache, Shape, activation_peaks
from .stage_costs import ConfigCosts, Pricer, RankMemory, calibrated_costs
from .throughput import Throughput



@dataclass(frozen=True)
class PlanRequest:
    """What to plan: a model, a cluster, a global batch (sequences), the search space.

    `memory_cap`: bytes per GPU (default: the cluster's usable memory); `top`: how many
    configurations to rank; `calibration`: take compute and transfer costs from a measured
    run instead of the cluster's throughput model (pipeline axis only); `exhaustive`:
    simulate every configuration that fits (no bound pruning; for figures and checks).
    """

    model: Transformer
    cluster: Cluster
    global_batch: int
    space: Space = Space()
    top: int = 10
    memory_cap: float | None = None
    calibration: Calibration | None = None
    exhaustive: bool = False

    @property
    def cap(self) -> float:
        return self.cluster.memory_cap if self.memory_cap is None else self.memory_cap


@dataclass(frozen=True)
class Evaluation:
    """A simulated configuration and its metrics (times in integer ns)."""

    config: Config
    costs: ConfigCosts
    step_ns: int
    makespan_ns: int
    bubble_ratio: float
    activation_peaks: tuple[int, ...]
    gpus: int
    seq_len: int
    peak_flops: float | None

    @property
    def step_time(self) -> float:
        return self.step_ns / 1e9

    @property
    def tokens_per_second(self) -> float:
        c = self.config
        return c.dp * c.microbatch_size * c.microbatches * self.seq_len / self.step_time

    @property
    def tflops_per_gpu(self) -> float:
        return self.costs.model_flops / self.step_time / self.gpus / 1e12

    @property
    def mfu(self) -> float | None:
        return None if self.peak_flops is None else self.tflops_per_gpu * 1e12 / self.peak_flops

    @property
    def exposed_data_parallel(self) -> float:
        """Seconds the step lasts beyond the pipeline's makespan (data-parallel work not hidden by the drain)."""
        return (self.step_ns - self.makespan_ns - self.costs.stage.step_overhead) / 1e9

    def rank_memory(self, rank: int) -> dict[str, float]:
        m: RankMemory = self.costs.ranks_memory[rank]
        return {"weights": m.weights, "gradients": m.gradients, "optimizer": m.optimizer,
                "activations": float(self.activation_peaks[rank]), "buffers": m.buffers}

    @property
    def peak_rank(self) -> int:
        totals = [sum(self.rank_memory(r).values()) for r in range(self.config.pp)]
        return max(range(len(totals)), key=totals.__getitem__)

    @property
    def memory(self) -> dict[str, float]:
        """Bytes per GPU by part, on the rank that needs the most."""
        return self.rank_memory(self.peak_rank)

    @property
    def memory_per_gpu(self) -> float:
        return sum(self.memory.values())

    def rank_key(self) -> tuple:
        return (self.step_ns, round(self.memory_per_gpu), self.config.key())


@dataclass
class SearchStats:
    """Counts and timings of one search."""

    enumerated: int = 0
    pruned_static: int = 0
    refused: int = 0
    pruned_memory: int = 0
    pruned_bound: int = 0
    visited: int = 0
    simulated: int = 0
    simulations_shared: int = 0
    builds: int = 0
    build_seconds: float = 0.0
    simulate_seconds: float = 0.0
    seconds: float = 0.0


@dataclass
class _Candidate:
    config: Config
    costs: ConfigCosts
    bound_ns: int
    static_fits: bool


@dataclass(frozen=True)
class Plan:
    """The answer: the top configurations, every evaluated feasible one, per-axis runner-ups."""

    request: PlanRequest
    ranked: tuple[Evaluation, ...]
    evaluated: tuple[Evaluation, ...]
    runner_ups: dict = field(default_factory=dict)
    stats: SearchStats = field(default_factory=SearchStats)

    @property
    def best(self) -> Evaluation:
        return self.ranked[0]


class Searcher:
    """Candidates of one request with their caches; `best` answers top-K questions exactly."""

    def __init__(self, request: PlanRequest, progress: Callable[[Iterable, int], Iterable] | None = None):
        self.request = request
        self.progress = progress or (lambda items, total: items)
        self.programs = ProgramCache()
        self.stats = SearchStats()
        self._simulations: dict = {}
        self._evaluated: dict[Config, Evaluation | None] = {}
        self.candidates = self._candidates()

    # ---------------------------------------------------------------- setup
    def _candidates(self) -> list[_Candidate]:
        r = self.request
        if r.global_batch < 1:
            raise PlanError(f"--global-batch must be a positive number of sequences, got {r.global_batch}")
        pricer = Pricer(r.model, r.cluster, Throughput.of(r.cluster.gpu))
        bounds = Bounds()
        largest: dict[tuple, tuple[int, ...]] = {}
        out = []
        for config in enumerate_configs(r.model, r.cluster.gpus, r.cluster.gpus_per_node, r.global_batch, r.space):
            self.stats.enumerated += 1
            placement = self.programs.placement(config.schedule, config.pp, config.chunks)
            try:
                if r.calibration is not None:
                    costs = calibrated_costs(config, r.model, r.calibration, placement)
                else:
                    costs = pricer(config, placement)
            except CostError as exc:
                raise PlanError(str(exc)) from None
            key = (costs.stage.memory, costs.placement)
            if key not in largest:
                largest[key] = _largest_stage(costs.stage.memory, costs.placement)
            fits = all(m.total + a <= r.cap for m, a in zip(costs.ranks_memory, largest[key]))
            if not fits:
                self.stats.pruned_static += 1
            out.append(_Candidate(config, costs, bounds(costs), fits))
        out.sort(key=lambda c: (c.bound_ns, c.config.key()))
        return out

    # ------------------------------------------------------------ evaluation
    def evaluate(self, candidate: _Candidate) -> Evaluation | None:
        """Simulate one configuration if it can run and fits; None otherwise (counted in stats)."""
        config = candidate.config
        if config in self._evaluated:
            return self._evaluated[config]
        result = None
        if candidate.static_fits:
            result = self._evaluate(candidate)
        self._evaluated[config] = result
        return result

    def _evaluate(self, candidate: _Candidate) -> Evaluation | None:
        config, costs = candidate.config, candidate.costs
        shape = Shape(config.schedule, config.pp, config.microbatches, config.chunks)
        before = self.programs.build_seconds
        try:
            occupancy = self.programs.occupancy(shape)
        except schedules.ScheduleError:
            self.stats.refused += 1
            return None
        finally:
            self.stats.build_seconds += self.programs.build_seconds - before
        stage = costs.stage
        peaks = activation_peaks(occupancy, stage.memory, stage.weight_memory)
        if any(m.total + a > self.request.cap for m, a in zip(costs.ranks_memory, peaks)):
            self.stats.pruned_memory += 1
            return None
        before = self.programs.build_seconds
        try:
            program = self.programs.program(shape)
        except schedules.ScheduleError:
            self.stats.refused += 1
            return None
        finally:
            self.stats.build_seconds += self.programs.build_seconds - before
        key = (shape, dataclasses.replace(stage, static=()))  # static memory does not change the timeline
        simulated = self._simulations.get(key)
        if simulated is None:
            start = time.perf_counter()
            runs = replay(compile_program(program, stage), stage.contention, stage.send_overhead, stage.recv_overhead)
            makespan = makespan_ns(runs)
            if any(len(r.times) // 2 < len(s) for r, s in zip(runs, program.streams)):
                raise PlanError(f"{config.describe()}: the simulated program deadlocked")
            busy = sum(r.busy for r in runs)
            simulated = (makespan, tuple(r.last for r in runs), tuple(r.peak for r in runs),
                         bubble_ratio(config.pp, makespan, busy))
            self._simulations[key] = simulated
            self.stats.simulated += 1
            self.stats.simulate_seconds += time.perf_counter() - start
        else:
            self.stats.simulations_shared += 1
        makespan, last, sim_peaks, bubble = simulated
        if list(sim_peaks) != peaks:
            raise RuntimeError(f"{config.describe()}: order-derived peaks {peaks} differ from the engine's {sim_peaks}")
        step = max([makespan] + [end + after for end, after in zip(last, costs.after_ns)]) + stage.step_overhead
        r = self.request
        peak_flops = None if r.calibration is not None else r.cluster.gpu.peak_flops
        return Evaluation(config, costs, step, makespan, bubble, tuple(sim_peaks), config.gpus,
                          r.model.seq_len, peak_flops)

    # ---------------------------------------------------------------- search
    def best(self, k: int, where: Callable[[Config], bool] | None = None, count: bool = False) -> list[Evaluation]:
        """The k best configurations satisfying `where`, exactly (bound pruning, module docstring)."""
        ranked: list[tuple[_Reversed, Evaluation]] = []  # heap whose root is the worst kept
        pool = [c for c in self.candidates if where is None or where(c.config)]
        visited = 0
        for candidate in self.progress(pool, len(pool)):
            if len(ranked) >= k and not self.request.exhaustive and candidate.bound_ns > ranked[0][1].step_ns:
                break
            visited += 1
            ev = self.evaluate(candidate)
            if ev is None:
                continue
            entry = (_Reversed(ev.rank_key()), ev)
            if len(ranked) < k:
                heapq.heappush(ranked, entry)
            elif ev.rank_key() < ranked[0][1].rank_key():
                heapq.heapreplace(ranked, entry)
        if count:
            self.stats.visited = visited
            self.stats.pruned_bound = len(pool) - visited
        return sorted((e[1] for e in ranked), key=Evaluation.rank_key)

    def evaluated(self) -> list[Evaluation]:
        return sorted((e for e in self._evaluated.values() if e is not None), key=Evaluation.rank_key)


def _largest_stage(memory: tuple[int, ...], placement: tuple[int, ...]) -> tuple[int, ...]:
    """Per rank, the activation bytes of one microbatch of its largest stage: what it holds at
    least, under any schedule, once that stage's first forward has started."""
    out = [0] * (max(placement) + 1)
    for s, rank in enumerate(placement):
        out[rank] = max(out[rank], memory[s])
    return tuple(out)


class _Reversed:
    """Wraps a key so that a min-heap orders it descending (the heap's root is the worst kept)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple):
        self.key = key

    def __lt__(self, other: "_Reversed") -> bool:
        return self.key > other.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and self.key == other.key


class Bounds:
    """Lower bounds on step times (module docstring); the pipeline part is shared by every
    configuration with the same stage costs, placement and m, so it is kept."""

    def __init__(self):
        self._pipeline: dict[tuple, tuple] = {}

    def __call__(self, costs: ConfigCosts) -> int:
        stage, config = costs.stage, costs.config
        key = (stage.forward, stage.backward, stage.input, stage.weight, stage.send_forward, stage.send_backward,
               costs.placement, config.microbatches, config.split_backward)
        ranks = self._pipeline.get(key)
        if ranks is None:
            ranks = self._pipeline[key] = _pipeline_bounds(stage, costs.placement, config.microbatches,
                                                           config.split_backward)
        bound = 0
        for (done, drained), after in zip(ranks, costs.after_ns):
            bound = max(bound, done + after, drained)
        return bound + stage.step_overhead


def _pipeline_bounds(stage, placement: tuple[int, ...], m: int, split: bool) -> tuple[tuple[int, int], ...]:
    """Per rank: (least end of its last compute, least end of the pipeline's drain after it)."""
    n = len(placement)
    head = [0] * (n + 1)  # head[s]: the first microbatch's forward through stages < s
    tail = [0] * (n + 1)  # tail[s]: a backward (B, or I when split) through stages < s
    back = stage.input if split else stage.backward
    for s in range(n):
        hop = s < n - 1 and placement[s] != placement[s + 1]
        head[s + 1] = head[s] + stage.forward[s] + (stage.send_forward[s] if hop else 0)
        tail[s + 1] = tail[s] + back[s] + (stage.send_backward[s] if hop else 0)
    held: dict[int, list[int]] = {}
    for s, rank in enumerate(placement):
        held.setdefault(rank, []).append(s)
    out = []
    for rank in range(len(held)):
        stages = held[rank]
        lowest = stages[0]
        if split:
            busy = m * sum(stage.forward[s] + stage.input[s] + stage.weight[s] for s in stages)
            weight = m * sum(stage.weight[s] for s in stages)
        else:
            busy = m * sum(stage.forward[s] + stage.backward[s] for s in stages)
            weight = 0
        done = head[lowest] + busy
        out.append((done, done - weight + tail[lowest]))
    return tuple(out)


def plan(request: PlanRequest, progress: Callable[[Iterable, int], Iterable] | None = None,
         explain: bool = False) -> Plan:
    """Rank the request's configurations (the top `request.top`, exact); with `explain`, also the
    best configuration that differs from the winner on each axis. PlanError if nothing fits."""
    start = time.perf_counter()
    searcher = Searcher(request, progress)
    if not searcher.candidates:
        raise PlanError(_no_candidates(request))
    ranked = searcher.best(request.top, count=True)
    if not ranked:
        raise PlanError(_nothing_fits(searcher))
    runner_ups = {}
    if explain:
        winner = ranked[0].config
        for axis in AXES:
            if axis == "chunks":
                def where(c: Config, w=winner) -> bool:
                    return c.schedule == w.schedule and c.chunks != w.chunks
            else:
                def where(c: Config, a=axis, w=winner) -> bool:
                    return getattr(c, a) != getattr(w, a)
            found = searcher.best(1, where)
            runner_ups[axis] = found[0] if found else None
        found = searcher.best(1, lambda c: c.tp == 1 and c.pp == 1)
        runner_ups["data_parallel_only"] = found[0] if found else None
    stats = searcher.stats
    stats.builds = searcher.programs.builds
    stats.seconds = time.perf_counter() - start
    return Plan(request, tuple(ranked), tuple(searcher.evaluated()), runner_ups, stats)


def _no_candidates(request: PlanRequest) -> str:
    r, c = request, request.cluster
    return (f"no legal configuration: {c.gpus} GPUs ({c.nodes} x {c.gpus_per_node}), global batch "
            f"{r.global_batch}, {r.model.name} ({r.model.layers} layers, {r.model.heads} heads) admit no t x p x d "
            "with t dividing the heads and the node, d dividing the batch and the fixed axes given")


def _nothing_fits(searcher: Searcher) -> str:
    r = searcher.request
    least = min(searcher.candidates, key=lambda c: max(m.total for m in c.costs.ranks_memory))
    states = max(m.total for m in least.costs.ranks_memory)
    s = searcher.stats
    return (f"nothing fits in {r.cap / 1e9:.3g} GB per GPU: the smallest model states and buffers of any "
            f"configuration ({least.config.describe()}) already take {states / 1e9:.1f} GB per GPU before "
            f"activations ({s.enumerated} configurations: {s.pruned_static} too big for any schedule, "
            f"{s.pruned_memory} too big with their schedule's activations, {s.refused} refused by their schedule)")
