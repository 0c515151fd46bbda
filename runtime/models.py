"""Models as sequences of layers that a pipeline cuts into stages, with their synthetic data.

A `PipelineModel` is: an optional `prologue` module (runs first, on stage 0: e.g. an
embedding), a sequence of `layers` (the units a pipeline partitions), an optional
`epilogue` (runs last, on the last stage: e.g. norm and LM head), a loss, and one batch of
inputs and targets. Built-in models (`mlp`, `gpt`) are made from a `ModelSpec`; the same
spec and seed give bit-identical parameters and data on every rank, so nothing is
broadcast. A user model comes in through `from_layers`.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from schedules.stages import balanced_layers

from .errors import ConfigError

LossFn = Callable[[Tensor, Tensor], Tensor]
MODELS = ("mlp", "gpt")


@dataclass(frozen=True, eq=False)
class PipelineModel:
    """Layers to partition, what runs before/after them, a mean-reduced loss, and one batch.

    The loss must average over the batch dimension (dim 0 of `inputs` and `targets`), as
    `mse_loss` and `cross_entropy` do by default: microbatch losses are then weighted by
    their share of the batch so the gradients equal the full-batch ones.
    """

    layers: tuple[nn.Module, ...]
    loss: LossFn
    inputs: Tensor
    targets: Tensor
    prologue: nn.Module | None = None
    epilogue: nn.Module | None = None
    name: str = "user"
    flags: Mapping[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.inputs.shape[0])

    def units(self) -> list[tuple[str, nn.Module]]:
        """All modules in order, with the names their parameters carry on every stage."""
        named = [] if self.prologue is None else [("prologue", self.prologue)]
        named += [(f"layer{i}", layer) for i, layer in enumerate(self.layers)]
        if self.epilogue is not None:
            named.append(("epilogue", self.epilogue))
        return named

    def full_module(self) -> nn.Sequential:
        """The whole model as one module (parameter names match `stage_module`'s)."""
        return nn.Sequential(OrderedDict(self.units()))

    def stage_module(self, layers: range, first: bool, last: bool) -> nn.Sequential:
        """The module of one stage: its layers, plus the prologue/epilogue at the ends."""
        named = [("prologue", self.prologue)] if first and self.prologue is not None else []
        named += [(f"layer{i}", self.layers[i]) for i in layers]
        if last and self.epilogue is not None:
            named.append(("epilogue", self.epilogue))
        return nn.Sequential(OrderedDict(named))


def from_layers(
    layers: nn.Sequential | Sequence[nn.Module],
    loss: LossFn,
    inputs: Tensor,
    targets: Tensor,
    prologue: nn.Module | None = None,
    epilogue: nn.Module | None = None,
    name: str = "user",
) -> PipelineModel:
    """A user model: every rank must build the same layers (same seed) and the same batch."""
    units = tuple(layers.children()) if isinstance(layers, nn.Sequential) else tuple(layers)
    if not units or not all(isinstance(u, nn.Module) for u in units):
        raise ConfigError("a user model needs a non-empty nn.Sequential or list of nn.Module layers")
    if inputs.shape[0] != targets.shape[0]:
        raise ConfigError(
            f"inputs and targets disagree on the batch size ({inputs.shape[0]} vs {targets.shape[0]})"
        )
    return PipelineModel(units, loss, inputs, targets, prologue, epilogue, name, {"model": name})


@dataclass(frozen=True)
class ModelSpec:
    """Flags of a built-in model. `hidden`, `heads`, `seq_len` and `vocab` as in GPT-2."""

    model: str = "mlp"
    layers: int = 8
    hidden: int = 512
    batch_size: int = 64
    heads: int = 8
    seq_len: int = 64
    vocab: int = 512
    seed: int = 0

    def check(self) -> None:
        """Raise ConfigError naming the first bad flag."""
        if self.model not in MODELS:
            raise ConfigError(f"unknown model {self.model!r}; built-in models: {', '.join(MODELS)}")
        names = ["layers", "hidden", "batch_size"]
        if self.model == "gpt":
            names += ["heads", "seq_len", "vocab"]
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer; got {value!r}")
        if self.model == "gpt" and self.hidden % self.heads:
            raise ConfigError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}")

    def flags(self) -> dict[str, Any]:
        keys = ["model", "layers", "hidden", "batch_size", "seed"]
        if self.model == "gpt":
            keys += ["heads", "seq_len", "vocab"]
        return {k: getattr(self, k) for k in keys}


def build(spec: ModelSpec) -> PipelineModel:
    """The built-in model of `spec` with its synthetic batch (deterministic in spec.seed)."""
    spec.check()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        if spec.model == "mlp":
            layers = tuple(nn.Sequential(nn.Linear(spec.hidden, spec.hidden), nn.ReLU()) for _ in range(spec.layers))
            prologue = epilogue = None
            loss: LossFn = F.mse_loss
        else:
            prologue = Embedding(spec.vocab, spec.hidden, spec.seq_len)
            layers = tuple(Block(spec.hidden, spec.heads) for _ in range(spec.layers))
            epilogue = LMHead(spec.hidden, spec.vocab)
            loss = token_cross_entropy
    data = torch.Generator().manual_seed(spec.seed + 1)
    if spec.model == "mlp":
        inputs = torch.randn(spec.batch_size, spec.hidden, generator=data)
        targets = torch.randn(spec.batch_size, spec.hidden, generator=data)
    else:
        inputs = torch.randint(spec.vocab, (spec.batch_size, spec.seq_len), generator=data)
        targets = torch.randint(spec.vocab, (spec.batch_size, spec.seq_len), generator=data)
    return PipelineModel(layers, loss, inputs, targets, prologue, epilogue, spec.model, spec.flags())


def token_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy averaged over every token of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Embedding(nn.Module):
    """Token plus learned position embedding: (batch, seq) ids -> (batch, seq, hidden)."""

    def __init__(self, vocab: int, hidden: int, seq_len: int):
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(seq_len, hidden)

    def forward(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.token(tokens) + self.position(positions)


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention with one fused qkv projection.

    The rows of `qkv.weight` are laid out head by head, [q, k, v] of head 0, then of head
    1, ... (Megatron-LM's fused layout, Shoeybi et al. 2019, section 3), so that cutting
    them into t contiguous blocks (column-parallel, runtime/tensor_parallel.py) gives each
    rank whole heads. The forward therefore reads the number of heads from the width of
    the projection it gets: all heads on one rank, heads / t on a tensor-parallel rank.
    """

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: Tensor) -> Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.head_dim)  # local heads under tensor parallelism
        q, k, v = qkv.view(batch, seq, heads, 3, self.head_dim).transpose(1, 2).unbind(3)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, heads * self.head_dim))


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention and a 4x MLP, each with a residual."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LMHead(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.norm(x))


def partition(num_layers: int, num_stages: int, split: Sequence[int] | None = None) -> tuple[range, ...]:
    """Contiguous layer ranges, one per stage: balanced by count, or `split` layers each.

    Balanced: schedules.stages.balanced_layers (floor(L/S) layers each, the first L mod S
    stages one more), the cut the simulator's calibration assumes too.
    """
    if split is not None:
        split = list(split)
        if len(split) != num_stages:
            raise ConfigError(f"--split lists {len(split)} stages but the schedule has {num_stages}")
        if any(not isinstance(n, int) or n < 1 for n in split):
            raise ConfigError(f"--split entries must be positive layer counts; got {split}")
        if sum(split) != num_layers:
            raise ConfigError(f"--split sums to {sum(split)} layers but the model has {num_layers}")
        bounds = [0]
        for size in split:
            bounds.append(bounds[-1] + size)
        return tuple(range(bounds[s], bounds[s + 1]) for s in range(num_stages))
    if num_layers < num_stages:
        raise ConfigError(f"the model has {num_layers} layers, fewer than the schedule's {num_stages} stages")
    return tuple(range(first, end) for first, end in balanced_layers(num_layers, num_stages))


def microbatch_sizes(batch_size: int, microbatches: int) -> list[int]:
    """Rows per microbatch when a batch is cut as torch.tensor_split cuts it."""
    if batch_size < microbatches:
        raise ConfigError(
            f"--batch-size {batch_size} is smaller than --microbatches {microbatches}: "
            "every microbatch needs at least one sample"
        )
    return [math.ceil((batch_size - i) / microbatches) for i in range(microbatches)]
