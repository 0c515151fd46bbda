"""The cost model: compute times, point-to-point transfers and activation memory.

Units: seconds for times, bytes for sizes, bytes per second for bandwidth.

Compute costs and memory sizes are given either as one number or as a list with one
entry per pipeline stage. One number means one microbatch through one *rank's* share
of the model, so that schedules with different chunk counts compare on the same model:
with v stages per rank each stage gets 1/v of it. A list gives each stage its own value
as is (a heavy embedding stage or LM head is just a larger entry).

Backward costs (per stage, after the rule above):

- ``backward_full`` (B) not given: ``backward_input`` (I) is required, ``backward_weight``
  (W) defaults to 0, and B = I + W.
- B given with neither I nor W: I = W = B / 2 (I rounded down to the nanosecond). For
  a linear layer Y = X A the input gradient dY A^T and the weight gradient X^T dY each
  take the forward's FLOPs, which is why Qi et al. (Zero Bubble Pipeline Parallelism,
  ICLR 2024) take T_B ~ T_W.
- B given with one of I, W: the other is B minus it (it must not come out negative).
- All three given: used as given (a fused B may be cheaper than a separate I and W).

``forward_split`` (default: ``forward``) is what an F costs whose backward the program splits
into I and W (schedules.analysis.split_forwards: an I of its stage and microbatch is in the
stream). The CPU executor runs such a forward's weight layers behind bridges that keep what W
needs (runtime.split), and at small microbatches that costs: in the fidelity sweep's calibration
runs a ZB-H1 run's F took 1.05-1.20x a 1F1B run's at 1-8 rows per microbatch, 1.00-1.05x at 64-256
(README, "A split forward costs more"). Switch, place, repeat and growth rules apply to it as to F.

Every time is rounded to whole nanoseconds per stage before B, I and W are derived from
each other, so the simulation runs on exact integers. Transfers between stages on
different ranks take ``p2p_latency + bytes / p2p_bandwidth`` seconds (rounded once),
where bytes is ``p2p_activation_bytes`` (forward) or ``p2p_gradient_bytes`` (backward,
default: the activation bytes) of that stage boundary. A scalar applies to every
boundary (the hidden state crossing a boundary does not shrink with v); a list has one
entry per boundary, entry s for the boundary between stages s and s+1. Stages on the
same rank hand tensors over in memory, at no cost. With ``link_contention`` each
directed link (rank -> peer) carries one transfer at a time, in the order the sender
issued them; without it transfers on a link overlap freely. ``p2p_load_latency`` (default
0) is what a transfer takes longer per rank computing while it is on the wire: it advances
at 1 / (t + p2p_load_latency x k) of its whole per second, t the time above and k the ranks
computing at that moment, so a constant k makes it t + p2p_load_latency x k (sim.engine.Wire).
On a CPU host a transfer's threads need a core that the ranks' compute holds: a transfer
sent while every rank waits is fast, one sent while the others compute is not
(sim.calibration fits it).

Fixed overheads of a real executor (seconds; all default to 0, the ideal machine):
``send_overhead`` is rank time spent issuing each SEND (the transfer is on the wire
from the SEND's start; the rank moves on after the overhead); ``recv_overhead`` is the
least rank time of each RECV (it ends at ``max(reached + recv_overhead, arrival)``);
``wake_overhead`` is rank time a SEND costs beyond ``send_overhead`` where the ranks share
cores (``cores``), its receiver had reached its RECV before the SEND was issued (strictly
earlier: the data wakes a rank that waits) and the ranks computing at that moment, with the
sender, fill the cores: the woken receiver then takes the sender's. Where four ranks share two
cores, a sender whose transfer wakes a waiting receiver loses its core for a while: on sweep
27's interleaved run at mlp 8 rows p=4 the gap after such a SEND averaged 257 us against 121 us
after the others, more the more ranks computed (README, "A send that wakes its receiver").
``step_overhead`` is what a training step takes beyond the makespan (the barriers and
bookkeeping around the streams): ``SimResult.step_time = makespan + step_overhead``.
``post_overhead`` is rank time per receive the executor posts before a rank's first action
(allocating its buffer and posting it; where receives are posted is ``post_ahead``, as the
executor's ``--post-ahead`` writes it: a count of compute actions, or "step" for every
receive of the step at its start, schedules.posting): rank r starts its stream
``post_overhead x`` that count later. With whole-step posting (the executor's default on
gloo) a rank posts every receive of its step first, so a schedule with more transfers, or
the same at a larger m, starts later: 26-35 us per receive on sweep 9's CPU runs at p=2,
37-50 us at p=4 (sim.calibration fits it).
A fixed per-compute-action overhead needs no field: it is part of each stage's F/B/I/W
cost (see sim.calibration, which fits it). ``switch_forward`` and ``switch_backward``
(the latter for B, I and W) are added to a compute action whose rank's previous
compute action was of another stage or kind, or which is its rank's first: on a CPU
the caches then hold another working set (another stage's weights, or the forward's
data where the backward needs gradients). Stage costs are those of an action that
repeats the previous one (GPipe's phases); 1F1B's steady state switches every action.
Repeats keep getting cheaper over a long run: the k-th action of a run of its stage and kind
(schedules.analysis.run_lengths; k = 1 switches) costs its stage cost times ``1 - discount x
(1 - 1 / (k - 1))`` from k = 3 on (`repeat_factor`: half the discount at the third, two thirds
at the fourth, all of it deep in a run), ``repeat_discount_forward`` for F and
``repeat_discount_backward`` for B, I and W (default 0: every repeat costs the stage cost).
On the CPU executor GPipe's third and later F cost 0.70-0.98 of what a calibration without it
charges them (README, "Repeated actions"); a multiple of the stage cost, it scales with the
stage's work, so that half-size stages (interleaved, V) repeat at the same ratio.
``place_factors`` maps a compute kind (``"F"``, ``"B"``, ``"I"``, ``"W"``) to factors for the
first actions of a stage and that kind in a step (schedules.analysis.places): the k-th
such action costs its stage cost times factor k (then the switch cost, if it switches),
later ones their stage cost. On a CPU executor the first backward of a stage assigns the
weight gradients that later ones add to (cheaper) and the first forward after the
optimizer step finds other data in the caches (dearer); sim.calibration fits them.
``compute_growth`` (per second, default 0) and ``growth_horizon`` (seconds): a compute action
that starts t into its step (the simulated step starts at 0) costs all of the above times
``1 + compute_growth x min(t, growth_horizon)`` (`growth_factor`), applied as the engine
starts it, so the same action costs more in a long step than in a short one. Where four ranks
shared two cores, an action's own thread CPU time went from 0.77-0.85 of its median 5-10 ms into
a step to 1.12-1.19 at 40-50 ms (README, "Dearer the longer the step"); sim.calibration fits it.

Spread of compute times (default none: every action costs its stage's value): real
compute actions vary around their typical cost, and a step's makespan is a max over
paths, so replaying typical costs predicts it short (the expected max exceeds the max of
expectations). ``duration_spread`` lists relative factors (their mean about 1; e.g. the
quantiles of measured durations over their typical value, sim.calibration fits them);
with it the program is replayed ``spread_draws`` times, each compute action's time
multiplied by its factor of that draw (`spread_factors`), and the result is the draw whose
step time is the median (below). The draws are stratified
(Latin hypercube sampling): over the draws, every position of a rank's stream takes each
value of the list equally often (as evenly as the draw count allows), in an order shuffled
per position by a generator seeded from the rank alone, so results stay deterministic. With
independent picks and 49 draws, the median draw of one program moved by 0.7-1.7% (standard
deviation over seeds) on calibrated runs of the fidelity sweep; stratified with 256 draws,
by 0.3-0.6%.
``transfer_spread`` does the same for transfer times (each SEND's transfer, on the
wire and on its link, multiplied by its factor; factors drawn from their own seeded
stream), for machines where a transfer's time varies as much as a compute action's.
``rank_spread`` is slowness shared by all of a rank's compute in one step (a rank that
loses its core for a while): each draw gives each rank one factor from the list (its own
seeded stream), which multiplies every compute action of that rank besides its own factor.
``step_spread`` is slowness shared by every rank's compute in one step (the machine as a
whole computing slower for a while: on sweep 9's CPU runs the ranks' factors in a step
correlate, 0.36 on average, 0.8 at gpt 8 rows p=2): each draw gives all ranks one factor
from the list (its own seeded stream), on top of the rank's and the action's. Drawn per
rank instead, that slowness would lengthen the slowest path of a draw more than it does.
``step_overhead_spread`` does the same for ``step_overhead`` (factors of it, one per draw,
their own seeded stream): a step's barriers and optimizer vary too, mostly independently of its
streams' span, and with a right tail, so the median step is longer than the median makespan plus
the median overhead. With any spread the result is the draw whose makespan plus its step
overhead is the median (lower median; ties by draw number).
``cores`` (default none: every rank computes on its own processor): the ranks' compute
shares that many processors, as on one host whose CPU executor runs more ranks than it has
cores (4 ranks on 2 cores): while k compute actions run, each advances at min(1, cores / k)
of its speed (processor sharing, the average of an operating system's time slices). A rank
waiting in a RECV takes none. sim.calibration takes it from the predicted run's host.
``idle_share`` (default 0, with ``cores``): the share of a core a rank takes while it is not
computing (the executor's own work between actions, receives that wake and poll): while k of
the R ranks compute, each advances at min(1, cores / (k + idle_share x (R - k))). Measured
runs of short actions need it (bench/processor_sharing.py); sim.calibration fits it from a
run whose ranks shared cores.
Data parallelism: a program lowered for d > 1 replicas (``schedules.lower(schedule, d)``)
holds one REDUCE_GRAD per stage. It all-reduces ``grad_reduce_bytes`` of that stage (per
stage, scalar split over a rank's v stages like compute) over ``data_parallel`` = d ranks in
``allreduce_latency + 2 (d - 1) / d x bytes / allreduce_bandwidth`` seconds: the ring
all-reduce's alpha-beta cost (Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH", 2005: each rank sends and receives 2 (d-1)/d of the
data). It runs on the rank's collective resource, one reduction at a time, without
blocking the rank's compute; the step ends when the last one has ended.

Memory: ``activation_memory`` bytes per microbatch per stage are allocated when its F
starts and freed when its B ends. With split backward, ``weight_memory`` bytes stay
allocated from the end of I until the end of W: in the notation of Qi et al. (2024), F
adds M_B, B (our I) frees M_B - M_W, W frees M_W. M_W may exceed M_B: what W needs is
each weight's input and the gradient at its output, and the gradients are made by I (an
MLP's Linear layers keep about twice what F saved; the executor measures both), so I
then allocates M_W - M_B when it starts. Two stages on one rank that hand a microbatch
over in memory (a V-shape's turn) may hold one storage between them, counted once
(``input_memory``, ``output_memory`` and their ``_weight_`` parts; rules in sim.handover).
``weight_memory`` defaults to ``weight_memory_fraction`` x activation_memory, and the
fraction to 0, so that by default peak memory counts the microbatches between F and I,
the in-flight count behind the paper's "ZB-H1 holds p, ZB-H2 2p-1" (set it to study
what W keeps alive). The default activation_memory, 1 GiB per rank share, is a
placeholder: results in rank-share units do not depend on it. ``static_memory`` (bytes
per rank: weights, gradients, optimizer state) is reported beside activation memory,
never inside it.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, Union

import numpy as np

from schedules import Kind, Program, Schedule, ScheduleError
from schedules.ir import COMPUTE_NAMES
from schedules.io import read_json
from schedules.posting import PostAhead

from .coverage import Note
from .handover import Handover, handovers

Number = Union[int, float]
PerStage = Union[Number, Sequence[Number]]

NS_PER_S = 1_000_000_000
DEFAULT_ACTIVATION_MEMORY = 2**30  # placeholder: one rank share = 1 GiB; unit-based results ignore it


class CostError(ValueError):
    """A cost model is malformed or does not fit the schedule it is applied to."""


class CostSource(Protocol):
    """Where a simulation's costs come from: a CostModel, or a calibration (sim.calibration)
    that cuts its model into any number of stages; `python -m sim` takes either."""

    def for_stages(self, num_stages: int) -> "CostModel":
        """The cost model of a program with `num_stages` stages."""

    def describe(self) -> str:
        """One line naming the costs, for figure titles."""

    def beyond(self, program: Program) -> list[Note]:
        """What `program` holds beyond what the costs were measured on (none for a cost model
        given as such)."""


def _as_values(name: str, value: Any, allow_none: bool = False) -> Number | tuple[float, ...] | None:
    """Check a scalar-or-list field; lists become tuples of floats."""
    if value is None:
        if allow_none:
            return None
        raise CostError(f"{name} is required")
    if isinstance(value, (list, tuple)):
        return tuple(_number(f"{name}[{i}]", v) for i, v in enumerate(value))
    return _number(name, value)


def repeat_factor(discount: float, length: int) -> float:
    """What a compute action costs, over its stage cost, as the `length`-th action of a run of its
    stage and kind (schedules.analysis.run_lengths): 1 up to the second, then 1 - discount x
    (1 - 1 / (length - 1))."""
    return 1.0 if length <= 2 else 1.0 - discount * (1.0 - 1.0 / (length - 1))


def growth_factor(growth: float, horizon: float, since_start):
    """What a compute action costs, over its price, when it starts `since_start` into its step
    (seconds, or ns with `growth` per ns and `horizon` in ns; a number or a numpy array):
    1 + growth x min(since_start, horizon). Where ranks share the cores, an action's own CPU time
    grows the longer its step has kept them busy (sim.calibration, `fit_growth`); past the
    horizon, the latest start its calibration runs held, the law is not extrapolated."""
    if isinstance(since_start, np.ndarray):
        return 1.0 + growth * np.minimum(since_start, horizon)
    return 1.0 + growth * min(since_start, horizon)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CostError(f"{name} must be a number, got {value!r}")
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise CostError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


HANDOVER_MEMORY = ("input_memory", "input_weight_memory", "output_memory", "output_weight_memory")  # CostModel's
SPREADS = ("duration_spread", "transfer_spread", "rank_spread", "step_spread", "step_overhead_spread")  # CostModel's


@dataclass(frozen=True)
class ResolvedCosts:
    """A cost model resolved for one schedule: integers (nanoseconds, bytes) per stage.

    `forward[s]`, `backward[s]`, `input[s]`, `weight[s]`: compute time of F, B, I, W of
    stage s; `forward_split[s]`: of an F whose backward is split; `send_forward[s]`/`send_backward[s]`:
    transfer time across boundary s|s+1;
    `memory[s]`: activation bytes of one microbatch on stage s; `weight_memory[s]`: the
    bytes kept from I until W; `handover[s]`: the storage stage s shares with stage s-1 on
    one rank (sim.handover), None if none; `static[r]`: static bytes of rank r; `send_overhead`,
    `recv_overhead`, `step_overhead`, `switch_forward`, `switch_backward`: the executor
    overheads of the cost model; `repeat_discount_forward`, `repeat_discount_backward`: what a
    long run of repeats saves (`repeat_factor`); `post_overhead` (ns per receive) and `post_ahead`
    (schedules.posting.PostAhead): what a rank posts before its first action and what that
    costs; `place_factors`: per compute kind, the factors of the first
    actions of a stage in a step; `spread`, `transfer_spread`, `rank_spread`, `step_spread`,
    `overhead_spread`, `draws`: duration_spread, transfer_spread, rank_spread, step_spread,
    step_overhead_spread and spread_draws.
    """

    forward: tuple[int, ...]
    backward: tuple[int, ...]
    input: tuple[int, ...]
    weight: tuple[int, ...]
    forward_split: tuple[int, ...]
    send_forward: tuple[int, ...]
    send_backward: tuple[int, ...]
    memory: tuple[int, ...]
    weight_memory: tuple[int, ...]
    static: tuple[int, ...]
    contention: bool
    send_overhead: int = 0
    wake_overhead: int = 0  # more per SEND whose receiver already waits, while the cores are full
    recv_overhead: int = 0
    step_overhead: int = 0
    switch_forward: int = 0
    switch_backward: int = 0
    repeat_discount_forward: float = 0.0
    repeat_discount_backward: float = 0.0
    growth: float = 0.0  # per ns into the step: a compute action's cost grows (growth_factor)
    growth_horizon: int = 0  # ns: the start past which it grows no more
    place_factors: tuple[tuple[Kind, tuple[float, ...]], ...] = ()
    spread: tuple[float, ...] = ()
    transfer_spread: tuple[float, ...] = ()
    rank_spread: tuple[float, ...] = ()
    step_spread: tuple[float, ...] = ()
    overhead_spread: tuple[float, ...] = ()
    draws: int = 1
    reduce_grad: tuple[int, ...] = ()  # per stage: ns of its REDUCE_GRAD all-reduce
    cores: int = 0  # processors the ranks' compute shares (0: each rank has its own)
    idle_share: float = 0.0  # share of a core a rank not computing takes, where cores are shared
    transfer_load: int = 0  # ns a transfer takes longer per rank computing meanwhile
    post_overhead: int = 0  # ns per receive posted before a rank's first action
    post_ahead: PostAhead = PostAhead()  # where the executor posts receives (schedules.posting)
    handover: tuple[Handover | None, ...] = ()  # per stage; () when no stage shares storage

    @property
    def drawn(self) -> bool:
        """Whether the program is replayed once per draw of a spread (module docstring)."""
        return self.draws > 1 or any((self.spread, self.transfer_spread, self.rank_spread, self.step_spread,
                                      self.overhead_spread))


@dataclass(frozen=True)
class CostModel:
    """Compute, transfer and memory costs for simulating a schedule (rules: module docstring).

    Per stage (scalar: one microbatch through one rank's share, split over its v stages;
    list: one entry per stage):
      forward, backward_input, backward_weight, backward_full -- seconds of F, I, W, B;
      forward_split -- seconds of an F whose backward is split into I and W (default forward);
      activation_memory -- bytes held from F until B (M_B of the zero-bubble paper);
      weight_memory -- bytes held from I until W (M_W, may exceed M_B); default
        weight_memory_fraction (0..1, default 0) x activation_memory;
      input_memory, output_memory -- bytes of those that are the stage's input's and its
        output's storage (default 0), and input_weight_memory, output_weight_memory -- what
        of these it holds from I until W: a same-rank handover's shared storage
        (sim.handover; measured by the executor's profile).
    Per stage boundary (scalar: every boundary; list: one entry per boundary):
      p2p_activation_bytes, p2p_gradient_bytes -- bytes sent forward and backward.
    Per rank (scalar or list): static_memory -- bytes, reported beside activations.
    Links: p2p_latency (seconds per transfer), p2p_bandwidth (bytes per second, default
    unlimited), link_contention (one transfer at a time per directed link, default on),
    p2p_load_latency (seconds a transfer takes longer per rank computing meanwhile, default 0).
    Executor overheads (seconds, default 0): send_overhead (rank time per SEND), wake_overhead
    (more rank time per SEND whose receiver had reached its RECV before it, where ranks share
    cores and the computing ranks and the sender fill them),
    recv_overhead (least rank time per RECV), step_overhead (step time minus makespan),
    post_overhead (rank time per receive posted before a rank's first action, placed by
    post_ahead: a count of compute actions or "step", default 0: each at its RECV),
    switch_forward / switch_backward (added to an F / a B, I or W that does not repeat
    its rank's previous compute action's stage and kind), repeat_discount_forward /
    repeat_discount_backward (0 <= discount < 1: the k-th action of a run of repeats costs its
    stage cost times 1 - discount x (1 - 1 / (k - 1)) from k = 3); place_factors (kind name -> factors
    of the first actions of a stage and kind in a step, module docstring); compute_growth (per
    second, default 0) and growth_horizon (seconds): a compute action starting t into its step
    costs 1 + compute_growth x min(t, growth_horizon) times its price (`growth_factor`).
    Spread (module docstring): duration_spread, transfer_spread, rank_spread, step_spread and
    step_overhead_spread (relative factors of compute times, transfer times, a rank's compute in
    a step, every rank's compute in a step and the step overhead; default none)
    and spread_draws (replays, default 256).
    cores (module docstring): processors the ranks' compute shares (default None: one each).
    Data parallelism (module docstring): data_parallel (d, replicas), grad_reduce_bytes
    (per stage), allreduce_latency (seconds), allreduce_bandwidth (bytes per second, default
    unlimited).
    """

    forward: PerStage
    backward_input: PerStage | None = None
    backward_weight: PerStage | None = None
    backward_full: PerStage | None = None
    forward_split: PerStage | None = None
    p2p_latency: float = 0.0
    p2p_bandwidth: float = math.inf
    p2p_activation_bytes: PerStage = 0
    p2p_gradient_bytes: PerStage | None = None
    activation_memory: PerStage = DEFAULT_ACTIVATION_MEMORY
    weight_memory_fraction: float = 0.0
    weight_memory: PerStage | None = None
    static_memory: PerStage = 0
    link_contention: bool = True
    p2p_load_latency: float = 0.0
    send_overhead: float = 0.0
    wake_overhead: float = 0.0
    recv_overhead: float = 0.0
    step_overhead: float = 0.0
    switch_forward: float = 0.0
    switch_backward: float = 0.0
    repeat_discount_forward: float = 0.0
    repeat_discount_backward: float = 0.0
    compute_growth: float = 0.0
    growth_horizon: float = 0.0
    place_factors: Mapping[str, Sequence[float]] | tuple = ()
    duration_spread: Sequence[float] = ()
    transfer_spread: Sequence[float] = ()
    rank_spread: Sequence[float] = ()
    step_spread: Sequence[float] = ()
    step_overhead_spread: Sequence[float] = ()
    spread_draws: int = 256
    data_parallel: int = 1
    grad_reduce_bytes: PerStage = 0
    allreduce_latency: float = 0.0
    allreduce_bandwidth: float = math.inf
    cores: int | None = None
    idle_share: float = 0.0
    post_overhead: float = 0.0
    post_ahead: int | str = 0
    input_memory: PerStage = 0
    input_weight_memory: PerStage = 0
    output_memory: PerStage = 0
    output_weight_memory: PerStage = 0

    def __post_init__(self) -> None:
        for name in ("forward", "p2p_activation_bytes", "activation_memory", "static_memory", *HANDOVER_MEMORY):
            object.__setattr__(self, name, _as_values(name, getattr(self, name)))
        for name in ("backward_input", "backward_weight", "backward_full", "forward_split", "p2p_gradient_bytes",
                     "weight_memory"):
            object.__setattr__(self, name, _as_values(name, getattr(self, name), allow_none=True))
        if self.backward_full is None and self.backward_input is None:
            raise CostError("give backward_input (with optional backward_weight) or backward_full")
        for name in ("p2p_latency", "p2p_load_latency", "send_overhead", "wake_overhead", "recv_overhead", "step_overhead",
                     "post_overhead", "switch_forward", "switch_backward"):
            object.__setattr__(self, name, _number(name, getattr(self, name)))
        for name in ("repeat_discount_forward", "repeat_discount_backward"):
            discount = getattr(self, name)
            if isinstance(discount, bool) or not isinstance(discount, (int, float)) or not 0.0 <= discount < 1.0:
                raise CostError(f"{name} must be a number from 0 up to (not including) 1, got {discount!r}")
        growth = self.compute_growth
        if isinstance(growth, bool) or not isinstance(growth, (int, float)) or not math.isfinite(growth):
            raise CostError(f"compute_growth must be a finite number (per second), got {growth!r}")
        horizon = _number("growth_horizon", self.growth_horizon)
        if growth_factor(growth, horizon, horizon) <= 0:
            raise CostError(f"compute_growth {growth!r} over growth_horizon {horizon!r} s would make compute free or "
                            "negative: 1 + compute_growth x growth_horizon must be > 0")
        bandwidth = self.p2p_bandwidth
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or not bandwidth > 0:
            raise CostError(f"p2p_bandwidth must be a number > 0 (bytes/s), got {bandwidth!r}")
        fraction = _number("weight_memory_fraction", self.weight_memory_fraction)
        if fraction > 1:
            raise CostError(f"weight_memory_fraction must be within 0..1, got {fraction!r}")
        if not isinstance(self.link_contention, bool):
            raise CostError(f"link_contention must be true or false, got {self.link_contention!r}")
        for name in SPREADS:
            spread = getattr(self, name)
            if not isinstance(spread, (list, tuple)):
                raise CostError(f"{name} must be a list of factors, got {spread!r}")
            object.__setattr__(self, name, tuple(_number(f"{name}[{i}]", x) for i, x in enumerate(spread)))
        places = self.place_factors
        if isinstance(places, tuple):  # already normalised (dataclasses.replace passes it back)
            places = dict(places)
        if not isinstance(places, Mapping) or any(k not in COMPUTE_NAMES for k in places):
            raise CostError(f"place_factors must map compute kinds ({', '.join(COMPUTE_NAMES)}) to lists of factors, "
                            f"got {places!r}")
        checked = {}
        for kind, factors in places.items():
            if not isinstance(factors, (list, tuple)):
                raise CostError(f"place_factors[{kind!r}] must be a list of factors, got {factors!r}")
            checked[kind] = tuple(_number(f"place_factors[{kind!r}][{i}]", x) for i, x in enumerate(factors))
        # A tuple of (kind, factors) pairs in kind order keeps the model hashable and its equality exact.
        object.__setattr__(self, "place_factors", tuple((k, checked[k]) for k in COMPUTE_NAMES if checked.get(k)))
        if self.cores is not None and (isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 1):
            raise CostError(f"cores must be a positive integer or null, got {self.cores!r}")
        if isinstance(self.idle_share, bool) or not isinstance(self.idle_share, (int, float)) or not (
                0.0 <= self.idle_share <= 1.0):
            raise CostError(f"idle_share must be a number from 0 to 1, got {self.idle_share!r}")
        try:
            PostAhead.parse(self.post_ahead)
        except ScheduleError as exc:
            raise CostError(f"post_ahead: {exc}") from None
        draws = self.spread_draws
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
            raise CostError(f"spread_draws must be an integer >= 1, got {draws!r}")
        object.__setattr__(self, "grad_reduce_bytes", _as_values("grad_reduce_bytes", self.grad_reduce_bytes))
        object.__setattr__(self, "allreduce_latency", _number("allreduce_latency", self.allreduce_latency))
        if isinstance(self.data_parallel, bool) or not isinstance(self.data_parallel, int) or self.data_parallel < 1:
            raise CostError(f"data_parallel must be a positive integer, got {self.data_parallel!r}")
        bandwidth = self.allreduce_bandwidth
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or not bandwidth > 0:
            raise CostError(f"allreduce_bandwidth must be a number > 0 (bytes/s), got {bandwidth!r}")

    # ------------------------------------------------------------ as a cost source
    def for_stages(self, num_stages: int) -> "CostModel":
        """The cost model of a program with `num_stages` stages: this one (scalars split over
        each rank's stages, lists checked against the stages when simulated). A calibration
        answers the same question by cutting its model (sim.sources.CostSource)."""
        return self

    def beyond(self, program: Program) -> list[Note]:
        """Nothing: a cost model given as such says nothing of what it was measured on (a
        calibration does, sim.coverage)."""
        return []

    def compute_scaled(self, factor: float) -> "CostModel":
        """This model with every compute cost (F, split F, B, I, W and the switch costs) times `factor`:
        the same program on a machine that computes 1 / `factor` as fast (place factors, being
        ratios, stay)."""
        def times(value):
            if value is None:
                return None
            return tuple(v * factor for v in value) if isinstance(value, tuple) else value * factor

        return replace(self, forward=times(self.forward), backward_input=times(self.backward_input),
                       backward_weight=times(self.backward_weight), backward_full=times(self.backward_full),
                       forward_split=times(self.forward_split), switch_forward=self.switch_forward * factor,
                       switch_backward=self.switch_backward * factor)

    def describe(self) -> str:
        """One line naming the compute (and transfer) costs, for figure titles."""
        def show(value) -> str:
            return f"{value:g} s" if isinstance(value, (int, float)) else "per stage"

        weight = self.backward_weight or 0.0
        if self.backward_full is None:
            parts = [f"F = {show(self.forward)}", f"I = {show(self.backward_input)}", f"W = {show(weight)}"]
            if isinstance(self.backward_input, (int, float)) and isinstance(weight, (int, float)):
                parts.append(f"full B = I + W = {self.backward_input + weight:g} s")
        else:
            parts = [f"F = {show(self.forward)}", f"B = {show(self.backward_full)}"]
        text = "costs per microbatch and rank share: " + ", ".join(parts)
        if self.p2p_latency:
            text += f"; transfer latency {self.p2p_latency:g} s"
        return text

    # ----------------------------------------------------------------- resolution
    def for_schedule(self, schedule: Schedule) -> ResolvedCosts:
        """Resolve every field to integers per stage (ns, bytes) for `schedule`."""
        n, v, p = schedule.num_stages, schedule.chunks, schedule.ranks
        forward = _per_stage("forward", self.forward, n, v)
        forward_split = _per_stage("forward_split", self.forward_split, n, v)
        full = _per_stage("backward_full", self.backward_full, n, v)
        inp = _per_stage("backward_input", self.backward_input, n, v)
        weight = _per_stage("backward_weight", self.backward_weight, n, v)
        backward, inp, weight = _split_backward(
            *(None if x is None else _ns(x) for x in (full, inp, weight))
        )
        memory = _per_stage("activation_memory", self.activation_memory, n, v)
        kept = _per_stage("weight_memory", self.weight_memory, n, v)
        if kept is None:
            kept = [self.weight_memory_fraction * x for x in memory]
        act_bytes = _per_boundary("p2p_activation_bytes", self.p2p_activation_bytes, n)
        grad_bytes = (
            act_bytes if self.p2p_gradient_bytes is None
            else _per_boundary("p2p_gradient_bytes", self.p2p_gradient_bytes, n)
        )
        static = _per_rank("static_memory", self.static_memory, p)
        held = {name: [round(x) for x in _per_stage(name, getattr(self, name), n, v)] for name in HANDOVER_MEMORY}
        for side in ("input", "output"):
            for s, (whole, until_w, act) in enumerate(zip(held[f"{side}_memory"], held[f"{side}_weight_memory"],
                                                          memory)):
                if whole > round(act) or until_w > whole:
                    raise CostError(f"stage {s}: {side}_memory ({whole} bytes) must lie within its activation_memory "
                                    f"({round(act)}) and {side}_weight_memory ({until_w}) within it")
        return ResolvedCosts(
            forward=_ns(forward),
            forward_split=_ns(forward if forward_split is None else forward_split),
            backward=backward,
            input=inp,
            weight=weight,
            send_forward=tuple(self.transfer_ns(b) for b in act_bytes),
            send_backward=tuple(self.transfer_ns(b) for b in grad_bytes),
            memory=tuple(round(x) for x in memory),
            weight_memory=tuple(round(x) for x in kept),
            handover=handovers(schedule.stage_to_rank, input_bytes=held["input_memory"],
                               input_weight_bytes=held["input_weight_memory"], output_bytes=held["output_memory"],
                               output_weight_bytes=held["output_weight_memory"]),
            static=tuple(round(x) for x in static),
            contention=self.link_contention,
            send_overhead=round(self.send_overhead * NS_PER_S),
            wake_overhead=round(self.wake_overhead * NS_PER_S),
            recv_overhead=round(self.recv_overhead * NS_PER_S),
            step_overhead=round(self.step_overhead * NS_PER_S),
            switch_forward=round(self.switch_forward * NS_PER_S),
            switch_backward=round(self.switch_backward * NS_PER_S),
            repeat_discount_forward=float(self.repeat_discount_forward),
            repeat_discount_backward=float(self.repeat_discount_backward),
            growth=float(self.compute_growth) / NS_PER_S,
            growth_horizon=round(self.growth_horizon * NS_PER_S),
            place_factors=tuple((Kind(k), v) for k, v in self.place_factors),
            spread=self.duration_spread,
            transfer_spread=self.transfer_spread,
            rank_spread=self.rank_spread,
            step_spread=self.step_spread,
            overhead_spread=self.step_overhead_spread,
            draws=self.spread_draws if any(getattr(self, name) for name in SPREADS) else 1,
            cores=self.cores or 0,
            idle_share=float(self.idle_share),
            transfer_load=round(self.p2p_load_latency * NS_PER_S),
            post_overhead=round(self.post_overhead * NS_PER_S),
            post_ahead=PostAhead.parse(self.post_ahead),
            reduce_grad=tuple(
                self.allreduce_ns(b) for b in _per_stage("grad_reduce_bytes", self.grad_reduce_bytes, n, v)
            ),
        )

    def allreduce_ns(self, num_bytes: float) -> int:
        """Nanoseconds of one ring all-reduce of `num_bytes` over `data_parallel` ranks."""
        d = self.data_parallel
        return round((self.allreduce_latency + 2 * (d - 1) / d * num_bytes / self.allreduce_bandwidth) * NS_PER_S)

    def transfer_ns(self, num_bytes: float) -> int:
        """Nanoseconds to move `num_bytes` across one link: latency + bytes / bandwidth."""
        return round((self.p2p_latency + num_bytes / self.p2p_bandwidth) * NS_PER_S)

    # ----------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (lists for per-stage values, null for infinite bandwidth)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            if f.name in ("p2p_bandwidth", "allreduce_bandwidth") and math.isinf(value):
                value = None
            if f.name == "place_factors":
                value = {k: list(v) for k, v in value}
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CostModel":
        """Inverse of to_dict; unknown keys are an error (they are probably typos)."""
        if not isinstance(data, dict):
            raise CostError(f"a cost model is a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise CostError(f"unknown cost model key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "forward" not in data:
            raise CostError("cost model has no 'forward' entry")
        values = dict(data)
        for name in ("p2p_bandwidth", "allreduce_bandwidth"):
            if values.get(name, 0) is None:
                values[name] = math.inf
        return cls(**values)

    def to_json(self, path: str | Path) -> None:
        """Write the cost model as a JSON object to `path`."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> "CostModel":
        """Read a cost model written by to_json (or by hand); raises CostError if malformed."""
        return cls.from_dict(read_json(path, CostError, "cost model "))


def processor_share(computing: int, cores: int, ranks: int, idle: float) -> float:
    """The speed (share of a processor) of each of `computing` compute actions when `ranks` ranks
    share `cores` processors and each rank not computing takes `idle` of one (module docstring,
    ``cores`` and ``idle_share``): min(1, cores / (k + idle x (ranks - k))). The one law the
    engine replays (sim.engine.Processors) and the calibration inverts (sim.calibration.full_speed)."""
    return min(1.0, cores / (max(computing, 1) + idle * max(ranks - computing, 0)))


def spread_factors(spread: Sequence[float], draws: int, rank: int, count: int,
                   what: str = "spread") -> list[list[float]]:
    """Per draw (0 .. draws - 1), the factors of the first `count` positions of rank `rank`'s
    stream (compute actions use those of `what` = "spread", SENDs those of "transfer", the
    rank's compute the first of "rank", every rank's compute the first of "step" at rank 0, the
    step overhead the first of "overhead" at rank 0); all 1 for an empty `spread`.

    Stratified (module docstring): position i's factors over the draws are
    ``spread[j * len(spread) // draws]`` for j = 0 .. draws - 1, shuffled by
    ``random.Random(f"bubblescope-{what}:{rank}")`` (one shuffle per position, in position
    order), so that the engine and any independent replay draw the same."""
    if not spread:
        return [[1.0] * count for _ in range(draws)]
    rng = random.Random(f"bubblescope-{what}:{rank}")
    levels = [spread[j * len(spread) // draws] for j in range(draws)]
    columns = []
    for _ in range(count):
        column = levels[:]
        rng.shuffle(column)
        columns.append(column)
    return [[column[d] for column in columns] for d in range(draws)]


def _per_stage(name: str, value, num_stages: int, chunks: int) -> list[float] | None:
    if value is None:
        return None
    if isinstance(value, tuple):
        if len(value) != num_stages:
            raise CostError(f"{name} lists {len(value)} values, but the schedule has {num_stages} stages")
        return list(value)
    return [value / chunks] * num_stages


def _per_boundary(name: str, value, num_stages: int) -> list[float]:
    boundaries = max(num_stages - 1, 0)
    if isinstance(value, tuple):
        if len(value) != boundaries:
            raise CostError(f"{name} lists {len(value)} values, but the schedule has {boundaries} stage boundaries")
        return list(value)
    return [value] * boundaries


def _per_rank(name: str, value, ranks: int) -> list[float]:
    if isinstance(value, tuple):
        if len(value) != ranks:
            raise CostError(f"{name} lists {len(value)} values, but the schedule has {ranks} ranks")
        return list(value)
    return [value] * ranks


def _split_backward(full, inp, weight) -> tuple[tuple[int, ...], ...]:
    """B, I and W per stage in nanoseconds, filled in by the rules in the module docstring."""
    if full is None:
        weight = weight if weight is not None else (0,) * len(inp)
        return tuple(i + w for i, w in zip(inp, weight)), inp, weight
    if inp is None and weight is None:
        return full, tuple(b // 2 for b in full), tuple(b - b // 2 for b in full)
    if inp is None:
        given, inp = "backward_weight", tuple(b - w for b, w in zip(full, weight))
    elif weight is None:
        given, weight = "backward_input", tuple(b - i for b, i in zip(full, inp))
    else:
        return full, inp, weight
    for s, (b, i, w) in enumerate(zip(full, inp, weight)):
        if i < 0 or w < 0:
            raise CostError(f"{given} of stage {s} exceeds its backward_full ({b / NS_PER_S} s)")
    return full, inp, weight


def _ns(seconds: Sequence[float]) -> tuple[int, ...]:
    return tuple(round(x * NS_PER_S) for x in seconds)
