"""The costs of one configuration: a per-stage `CostModel` for the engine plus what lies around it.

For a `Config` on a `Cluster` (or with a `Calibration` of a measured run), this module
gives the engine its per-stage F, B, I, W times, transfer times and activation bytes, and
gives the search what the engine does not model: static memory per rank (weights,
gradients, optimizer state, buffers) and the data-parallel work after each rank's last
backward.

**Placement** of GPU ranks (Megatron-LM's default order): tensor-parallel ranks are
adjacent, data-parallel ranks next (stride t), pipeline ranks outermost (stride t x d). A
collective group whose span fits in a node runs on the intra-node link. One that spans
nodes runs at the inter-node bandwidth and latency of one GPU's adapter, however many of
its ranks share a node: every rank moves its whole ring volume, (n-1)/n x N per all-gather
or reduce-scatter, through its own adapter. NCCL's ideal, where the k ranks on a node form
k rings that each cross between nodes once, would give k x that. The published runs mostly
side with one adapter: SC'21's ZeRO-3 runs (Table 2) take the same 66.7 s per iteration on
768 and 1536 GPUs (by their eq. 3), each GPU moving the same bytes, and its Table 1 runs
with t = 1 and 2 (eight and four data-parallel ranks per node) were over-predicted by 7% and
4% with k x; against it, its Fig. 14 and 15 at batch 32 (README, "Planning a training run").
A pipeline boundary uses the intra-node link when its two stages' ranks sit on one node,
else one adapter.

**Compute per stage** (sim.planner.throughput for the achieved-throughput model): its
layers (schedules.stages.balanced_layers: the executor's balanced cut), plus the embedding
on the first stage and the final norm, LM head and loss on the last. Per layer and
microbatch: F = GEMMs + attention core + element-wise traffic + the tensor-parallel
collectives of the forward (two all-reduces of the 2sbh-byte activation, or with sequence
parallelism two all-gathers and two reduce-scatters: the same ring time); I = input-gradient
GEMMs + twice the core + twice the traffic + the backward's two collectives, plus the
recomputed forward (full: all of F; selective: the core and its traffic); W = the
weight-gradient GEMMs. B = I + W. The vocabulary-parallel embedding all-reduces (or
reduce-scatters) its output; the LM head all-gathers its input with sequence parallelism and
reduces its input gradient in the backward; the loss all-reduces three 32-bit numbers per
token. These collectives are on the critical path (not overlapped with compute).

**ZeRO** (FSDP's and DeepSpeed's schedule of it): stage 3 gathers a layer's weights before its
forward and again before its backward, on the data-parallel group's link; stages 2 and 3
reduce-scatter a layer's gradients after each microbatch's backward (as DeepSpeed does under
gradient accumulation, and FSDP without no_sync). Each is prefetched one layer ahead, in
the order the layers run (across microbatches and stages too): layer i+1's gather and layer
i-1's reduce-scatter run while layer i computes, so a layer's action takes the longer of
its compute and its collective, every layer and microbatch, each collective paying its
latency ((d - 1) alpha on a ring). What nothing hides: the step's first gather, before
any compute, and the reduce-scatter of the last layer to finish its backward: both are
added to the data-parallel work after the rank's last backward (below).

**Pipeline transfers**: the boundary activation (and its gradient), 2sbh/t bytes per
microbatch (split across the tensor-parallel ranks: Megatron's scatter/gather, or sequence
parallelism), point to point on the boundary's link. The engine takes one link model for all
boundaries and bytes per boundary, so each boundary's transfer time is handed to it as bytes
on a 1 GB/s reference link (1 byte = 1 ns).

**Data-parallel work after the step's compute** (per pipeline rank, starting when that
rank's last backward ends, so that it overlaps the other ranks' drain): ZeRO 0 all-reduces
the 16-bit gradients; ZeRO 1 reduce-scatters them, runs the optimizer on its shard and
all-gathers the 16-bit weights; ZeRO 2 (gradients already reduced) runs the optimizer and
all-gathers; ZeRO 3 runs the optimizer (plus its one exposed gather and reduce-scatter, and
ZeRO 2 its one exposed reduce-scatter, above). The optimizer is HBM-bound: Adam reads a 16-bit
gradient and three 32-bit states and writes the states and a 16-bit weight, 28 bytes per
parameter of the shard.

**Memory per rank** besides activations: model states (sim.planner.memory, ZeRO) of the
rank's parameters divided by t (a tied embedding is held by both end stages), and buffers:
one activation and one gradient receive buffer per incoming boundary, the activations of
the layer being recomputed under full recomputation, and two layers' gathered weights
under ZeRO 3.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.stages import balanced_layers
from sim.calibration import Calibration
from sim.costs import NS_PER_S, CostModel, ResolvedCosts

from . import collectives, flops, memory
from .cluster import Cluster, Link
from .config import Config
from .models import Transformer
from .throughput import Throughput

OPTIMIZER_BYTES_PER_PARAM = 28
REFERENCE_BANDWIDTH = 1e9  # bytes/s of the link the engine is told about (1 byte = 1 ns)


@dataclass(frozen=True)
class RankMemory:
    """Bytes per GPU of one pipeline rank besides its activations."""

    weights: float
    gradients: float
    optimizer: float
    buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.buffers


@dataclass(frozen=True)
class Layout:
    """The sizes CostModel.for_schedule reads from a schedule (no need to build one)."""

    ranks: int
    chunks: int
    num_stages: int
    stage_to_rank: tuple[int, ...]  # where a same-rank handover shares storage (sim.handover)


@dataclass(frozen=True)
class ConfigCosts:
    """Everything the search needs about one configuration's costs.

    `stage`: the per-stage costs resolved to integers, exactly what `cost_model()` resolves to
    for this configuration's schedule (what the engine runs on); `ranks_memory[r]`: rank r's
    memory besides activations; `after_ns[r]`: the data-parallel work rank r does after its
    last compute action; `model_flops`: one iteration's model FLOPs.
    """

    config: Config
    stage: ResolvedCosts
    placement: tuple[int, ...]
    ranks_memory: tuple[RankMemory, ...]
    after_ns: tuple[int, ...]
    model_flops: float
    source: CostModel | None = None

    def cost_model(self) -> CostModel:
        """The per-stage CostModel of this configuration (sim.simulate(program, it) replays it)."""
        if self.source is not None:
            return self.source
        s = self.stage
        ns = NS_PER_S
        return CostModel(
            forward=[x / ns for x in s.forward], backward_full=[x / ns for x in s.backward],
            backward_input=[x / ns for x in s.input], backward_weight=[x / ns for x in s.weight],
            p2p_latency=0.0, p2p_bandwidth=REFERENCE_BANDWIDTH,
            p2p_activation_bytes=list(s.send_forward) if s.send_forward else 0,
            activation_memory=list(s.memory), weight_memory=list(s.weight_memory),
            static_memory=list(s.static),
        )


def group_link(cluster: Cluster, stride: int, size: int) -> Link:
    """The link a collective over `size` ranks `stride` apart runs on (module docstring)."""
    g = cluster.gpus_per_node
    if stride * size <= g and g % (stride * size) == 0:
        return cluster.intra
    return cluster.inter


def _ns(seconds: float) -> int:
    return round(seconds * NS_PER_S)


def _stage_params(model: Transformer, layers: list[int]) -> list[float]:
    n = len(layers)
    out = []
    for s, count in enumerate(layers):
        params = count * flops.layer_params(model)
        if s == 0:
            params += flops.embedding_params(model)
        if s == n - 1:
            params += flops.head_params(model)
            if model.tied_embeddings and n > 1:
                params += model.vocab * model.hidden  # Megatron keeps a copy of the tied matrix here
        out.append(params)
    return out


@dataclass(frozen=True)
class _LayerCosts:
    """Seconds and bytes of one layer and of the model's two ends, for one microbatch on one GPU."""

    forward: float
    inputs: float
    weights: float
    exposed: float  # ZeRO's collectives per step that no compute hides (module docstring)
    activations: float
    kept: float
    embed_forward: float
    embed_weight: float
    head_forward: float
    head_input: float
    head_weight: float
    first_extra: float
    last_extra: float
    boundary: float
    recompute_buffer: float
    gathered_weights: float


class Pricer:
    """Prices configurations of one model on one cluster (module docstring); the parts that many
    configurations share (per-layer costs, per-stage lists, transfers) are computed once."""

    def __init__(self, model: Transformer, cluster: Cluster, throughput: Throughput):
        self.model, self.cluster, self.th = model, cluster, throughput
        self._layers: dict[tuple, _LayerCosts] = {}
        self._stages: dict[tuple, tuple] = {}
        self._sends: dict[tuple, tuple[int, ...]] = {}
        self._params: dict[int, list[float]] = {}
        self._held: dict[tuple[int, ...], tuple] = {}
        self._rank_parts: dict[tuple, tuple] = {}

    def _tp_link(self, t: int) -> Link:
        return group_link(self.cluster, 1, t)

    def _dp_link(self, t: int, d: int) -> Link:
        return group_link(self.cluster, t, d)

    def layer(self, t: int, b: int, sp: bool, recompute: str, zero: int, d: int) -> _LayerCosts:
        """Per-layer and end costs (cached by the axes they depend on)."""
        zero_key = (zero if zero >= 2 else 0, d if zero >= 2 else 1)
        key = (t, b, sp, recompute) + zero_key
        cached = self._layers.get(key)
        if cached is None:
            cached = self._layers[key] = self._layer(t, b, sp, recompute, *zero_key)
        return cached

    def _layer(self, t: int, b: int, sp: bool, recompute: str, zero: int, d: int) -> _LayerCosts:
        model, th = self.model, self.th
        tp_link, dp_link = self._tp_link(t), self._dp_link(t, d)
        fwd = flops.forward_flops(model, b)
        acts = memory.layer_activations(model, b)
        traffic = acts.replicated / (t if sp else 1) + acts.split / t + acts.core / t
        hidden_bytes = 2.0 * model.seq_len * b * model.hidden  # one 16-bit activation of the layer's width

        def pair(num_bytes: float) -> float:
            """A layer's two collectives (all-reduce; with sp all-gather + reduce-scatter)."""
            if sp:
                return 2 * (collectives.all_gather(num_bytes, t, tp_link)
                            + collectives.reduce_scatter(num_bytes, t, tp_link))
            return 2 * collectives.all_reduce(num_bytes, t, tp_link)

        def reduce(num_bytes: float) -> float:
            if sp:
                return collectives.reduce_scatter(num_bytes, t, tp_link)
            return collectives.all_reduce(num_bytes, t, tp_link)

        forward = th.gemm((fwd.gemm + fwd.core) / t) + th.traffic(traffic) + pair(hidden_bytes)
        inputs = th.gemm((fwd.gemm + 2 * fwd.core) / t) + th.traffic(2 * traffic) + pair(hidden_bytes)
        if recompute == "full":
            inputs += forward
        elif recompute == "selective":
            inputs += th.gemm(fwd.core / t) + th.traffic(acts.core / t)
        weights = th.gemm(fwd.gemm / t)
        layer_weights = memory.WEIGHT_BYTES * flops.layer_params(model) / t
        exposed = 0.0
        if zero >= 3:
            gather = collectives.all_gather(layer_weights, d, dp_link)
            forward, inputs = max(forward, gather), max(inputs, gather)
            exposed += gather
        if zero >= 2:
            scatter = collectives.reduce_scatter(layer_weights, d, dp_link)
            weights = max(weights, scatter)
            exposed += scatter
        logits = 4.0 * model.seq_len * b * model.vocab / t
        loss = 3 * collectives.all_reduce(4.0 * model.seq_len * b, t, tp_link)
        gather_input = collectives.all_gather(hidden_bytes, t, tp_link) if sp else 0.0
        return _LayerCosts(
            forward=forward, inputs=inputs, weights=weights,
            exposed=exposed,
            activations=memory.activation_per_layer(model, b, t, sp, recompute),
            kept=memory.weight_kept_per_layer(model, b, t, sp),
            embed_forward=th.traffic(hidden_bytes) + reduce(hidden_bytes),
            embed_weight=th.traffic(hidden_bytes),
            head_forward=th.gemm(fwd.head / t) + th.traffic(2 * logits) + loss + gather_input,
            head_input=th.gemm(fwd.head / t) + th.traffic(2 * logits) + reduce(hidden_bytes),
            head_weight=th.gemm(fwd.head / t),
            first_extra=memory.first_stage_extra(model, b, t, sp),
            last_extra=memory.last_stage_extra(model, b, t, sp),
            boundary=hidden_bytes / t,
            recompute_buffer=traffic if recompute == "full" else 0.0,
            gathered_weights=2 * layer_weights if zero >= 3 else 0.0,
        )

    def _stage_lists(self, lc: _LayerCosts, n: int, split: bool) -> tuple:
        key = (id(lc), n, split)
        cached = self._stages.get(key)
        if cached is not None:
            return cached
        layers = [hi - lo for lo, hi in balanced_layers(self.model.layers, n)]
        forward, inputs, act, kept = [], [], [], []
        for s, count in enumerate(layers):
            first, last = s == 0, s == n - 1
            forward.append(_ns(count * lc.forward + (lc.embed_forward if first else 0) + (lc.head_forward if last else 0)))
            i = count * lc.inputs + (lc.head_input if last else 0)
            w = count * lc.weights + (lc.embed_weight if first else 0) + (lc.head_weight if last else 0)
            inputs.append((_ns(i), _ns(w), _ns(i + w)))
            act.append(round(count * lc.activations + (lc.first_extra if first else 0) + (lc.last_extra if last else 0)))
            kept.append(round(count * lc.kept) if split else 0)
        cached = (tuple(forward), tuple(x[0] for x in inputs), tuple(x[1] for x in inputs),
                  tuple(x[2] for x in inputs), tuple(act), tuple(kept), layers)
        self._stages[key] = cached
        return cached

    def _send_list(self, placement: tuple[int, ...], t: int, d: int, boundary: float) -> tuple[int, ...]:
        key = (placement, t, d, boundary)
        cached = self._sends.get(key)
        if cached is None:
            g = self.cluster.gpus_per_node
            sends = []
            for s in range(len(placement) - 1):
                a, c = placement[s] * t * d, placement[s + 1] * t * d
                seconds = collectives.point_to_point(boundary, self.cluster.link(a // g == c // g))
                sends.append(round((0.0 + _ns(seconds) / REFERENCE_BANDWIDTH) * NS_PER_S))  # as CostModel.transfer_ns
            cached = self._sends[key] = tuple(sends)
        return cached

    def _ranks(self, placement: tuple[int, ...]) -> tuple:
        """Per rank: (its stages, how many of them receive from another rank), cached."""
        cached = self._held.get(placement)
        if cached is None:
            held = [[] for _ in range(max(placement) + 1)]
            for s, rank in enumerate(placement):
                held[rank].append(s)
            cached = self._held[placement] = tuple(
                (tuple(h), sum(1 for s in h if s > 0 and placement[s - 1] != rank)) for rank, h in enumerate(held))
        return cached

    def __call__(self, config: Config, placement: tuple[int, ...]) -> ConfigCosts:
        """The costs of `config`; `placement` is its schedule's stage_to_rank."""
        t, d = config.tp, config.dp
        n = config.num_stages
        lc = self.layer(t, config.microbatch_size, config.sequence_parallel, config.recompute, config.zero, d)
        forward, inputs, weights, backward, act, kept, layers = self._stage_lists(lc, n, config.split_backward)
        sends = self._send_list(placement, t, d, lc.boundary)
        if n not in self._params:
            self._params[n] = _stage_params(self.model, layers)
        stage_params = self._params[n]
        dp_link = self._dp_link(t, d)
        ranks_memory, after = [], []
        for held, incoming in self._ranks(placement):
            params = sum(stage_params[s] for s in held) / t
            key = (params, config.zero, d, t, lc.exposed)
            rank = self._rank_parts.get(key)
            if rank is None:
                states = memory.model_states(params, d, config.zero)
                rank = self._rank_parts[key] = (
                    states, _ns(_data_parallel_after(params, config.zero, d, dp_link, self.th) + lc.exposed))
            states, after_ns = rank
            buffers = incoming * 2 * lc.boundary + lc.recompute_buffer + lc.gathered_weights
            ranks_memory.append(RankMemory(states.weights, states.gradients, states.optimizer, buffers))
            after.append(after_ns)
        stage = ResolvedCosts(
            # FLOP-priced: a forward whose backward is split does the same work (its bridges' cost
            # is the CPU executor's, sim.costs)
            forward=forward, forward_split=forward, backward=backward, input=inputs, weight=weights,
            send_forward=sends, send_backward=sends, memory=act, weight_memory=kept,
            static=tuple(round(m.total) for m in ranks_memory), contention=True,
        )
        return ConfigCosts(config, stage, placement, tuple(ranks_memory), tuple(after),
                           flops.model_flops(self.model, config.microbatch_size * config.microbatches * d))


def _data_parallel_after(params: float, zero: int, d: int, link, th: Throughput) -> float:
    """Seconds of data-parallel work after a rank's last backward (module docstring)."""
    gradients = memory.GRADIENT_BYTES * params
    weights = memory.WEIGHT_BYTES * params
    shard = params / (d if zero >= 1 else 1)
    optimizer = th.traffic(OPTIMIZER_BYTES_PER_PARAM * shard)
    if zero == 0:
        return collectives.all_reduce(gradients, d, link) + optimizer
    if zero == 1:
        return collectives.reduce_scatter(gradients, d, link) + optimizer + collectives.all_gather(weights, d, link)
    if zero == 2:
        return optimizer + collectives.all_gather(weights, d, link)
    return optimizer


def calibrated_costs(config: Config, model: Transformer, calibration: Calibration,
                     placement: tuple[int, ...]) -> ConfigCosts:
    """Costs from a measured run's calibration (pipeline axis only: t = d = 1): the
    calibration's per-stage cost model for this many stages, model states as above."""
    n = config.num_stages
    cost_model = calibration.cost_model(n)
    layers = [hi - lo for lo, hi in balanced_layers(model.layers, n)]
    stage_params = _stage_params(model, layers)
    ranks_memory = []
    for rank in range(config.pp):
        params = sum(stage_params[s] for s in range(n) if placement[s] == rank)
        states = memory.model_states(params, 1, 0)
        ranks_memory.append(RankMemory(states.weights, states.gradients, states.optimizer, 0.0))
    layout = Layout(config.pp, config.chunks, n, tuple(placement))
    return ConfigCosts(
        config=config, stage=cost_model.for_schedule(layout), placement=placement,
        ranks_memory=tuple(ranks_memory), after_ns=(0,) * config.pp,
        model_flops=flops.model_flops(model, config.microbatch_size * config.microbatches), source=cost_model,
    )
