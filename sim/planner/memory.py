"""Memory per GPU in closed form: model states (ZeRO) and activations per layer (Korthikanti).

**Model states** (Rajbhandari et al. 2020, "ZeRO", §5 and Figure 1): mixed-precision Adam
keeps 2 bytes of 16-bit weights and 2 of 16-bit gradients per parameter, and K = 12 bytes of
optimizer state (32-bit master weights, momentum and variance). With N_d data-parallel
ranks: stage 0 holds (2 + 2 + K) Psi; stage 1 (P_os) partitions the optimizer state,
2 Psi + 2 Psi + K Psi / N_d; stage 2 (P_os+g) the gradients too, 2 Psi + (2 + K) Psi / N_d;
stage 3 (P_os+g+p) everything, (2 + 2 + K) Psi / N_d. The paper's example: Psi = 7.5B,
N_d = 64 gives 120, 31.4, 16.6 and 1.9 GB.

**Activations** of one layer for one microbatch of b sequences of s tokens, in bytes
(16-bit tensors, 1-byte dropout masks), after Korthikanti et al. 2022 §4 (their sbh(34 +
5as/h) for GPT), tensor by tensor so that grouped-query attention and gated FFNs fit:

- kept whole on every tensor-parallel rank unless sequence parallelism splits them: the
  inputs of both norms (2sbh each), the inputs of the QKV and first FFN GEMMs (2sbh each),
  and two dropout masks (sbh each) when the model trains with dropout: 10 sbh for GPT;
- split by t: Q (2sbh), K and V (2sb kv each), the output projection's input (2sbh), and
  the FFN's inner tensors (2sbf twice; gated: gate, up, their activation and product, 2sbf
  each): 24 sbh for GPT;
- the attention core, split by t: softmax output 2as^2b, its dropout mask as^2b and the
  dropout output 2as^2b (5as^2b; without dropout only the 2as^2b softmax output).

Tensor parallelism: 10 + 24/t + 5as/(ht) (times sbh); with sequence parallelism:
34/t + 5as/(ht); selective recomputation drops the attention core; full recomputation
keeps only each layer's input, 2sbh (2sbh/t with sequence parallelism). The first stage
keeps the embedding's dropout mask (sbh), the last stage the final norm's and the LM head's
inputs and the 32-bit logits for the loss, 4sbh (1 + V/h)/t with sequence parallelism
(Korthikanti et al. §4.3); without it the two inputs are whole (4sbh + 4sbV/t).

With the backward split into I and W (zero-bubble schedules), what W needs (each GEMM's
input and output gradient) stays from I until W: 32/34 of a layer's non-core activations,
the ratio Qi et al. (2024) give.
"""

from __future__ import annotations

from dataclasses import dataclass

from .axes import RECOMPUTE
from .models import Transformer

ADAM_K = 12  # bytes of optimizer state per parameter, mixed-precision Adam (ZeRO's K)
WEIGHT_BYTES = 2
GRADIENT_BYTES = 2
KEPT_FOR_W = 32 / 34  # share of a layer's non-core activations W needs after I (Qi et al. 2024)


@dataclass(frozen=True)
class ModelStates:
    """Bytes per GPU of 16-bit weights, 16-bit gradients and optimizer state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def model_states(params: float, data_parallel: int, zero: int, k: int = ADAM_K) -> ModelStates:
    """ZeRO's model states for `params` parameters held by this GPU's model shard, over
    `data_parallel` ranks at ZeRO stage `zero` (0-3)."""
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0-3, got {zero!r}")
    d = data_parallel
    return ModelStates(
        weights=WEIGHT_BYTES * params / (d if zero >= 3 else 1),
        gradients=GRADIENT_BYTES * params / (d if zero >= 2 else 1),
        optimizer=k * params / (d if zero >= 1 else 1),
    )


@dataclass(frozen=True)
class LayerActivations:
    """Bytes of one layer's activations for one microbatch, by how tensor parallelism treats them."""

    replicated: float  # whole on every tensor-parallel rank unless sequence parallel
    split: float  # divided by t
    core: float  # the attention core, divided by t; dropped by selective recomputation
    layer_input: float  # what full recomputation keeps


def layer_activations(model: Transformer, sequences: int) -> LayerActivations:
    """The tensors of one layer (module docstring), for `sequences` sequences."""
    sb = model.seq_len * sequences
    h, f, kv, a = model.hidden, model.ffn_hidden, model.kv_dim, model.heads
    masks = 2 * sb * h if model.dropout else 0
    replicated = 4 * 2 * sb * h + masks
    inner = (4 if model.gated else 2) * 2 * sb * f
    split = 2 * sb * h + 2 * 2 * sb * kv + 2 * sb * h + inner
    core = (5 if model.dropout else 2) * a * model.seq_len * sb
    return LayerActivations(replicated, split, core, 2 * sb * h)


def activation_per_layer(model: Transformer, sequences: int, tp: int, sp: bool, recompute: str) -> float:
    """Bytes one layer keeps for the backward, per microbatch, per GPU."""
    acts = layer_activations(model, sequences)
    if recompute == "full":
        return acts.layer_input / (tp if sp else 1)
    kept = acts.replicated / (tp if sp else 1) + acts.split / tp
    if recompute == "none":
        kept += acts.core / tp
    elif recompute != "selective":
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    return kept


def weight_kept_per_layer(model: Transformer, sequences: int, tp: int, sp: bool) -> float:
    """Bytes per layer kept from I until W (split backward), per microbatch, per GPU."""
    acts = layer_activations(model, sequences)
    return KEPT_FOR_W * (acts.replicated / (tp if sp else 1) + acts.split / tp)


def first_stage_extra(model: Transformer, sequences: int, tp: int, sp: bool) -> float:
    """Activation bytes the embedding adds to the first stage, per microbatch: its dropout mask."""
    if not model.dropout:
        return 0.0
    return model.seq_len * sequences * model.hidden / (tp if sp else 1)


def last_stage_extra(model: Transformer, sequences: int, tp: int, sp: bool) -> float:
    """Activation bytes the final norm, LM head and loss add to the last stage, per microbatch."""
    sb = model.seq_len * sequences
    inputs = 2 * 2 * sb * model.hidden / (tp if sp else 1)
    logits = 4 * sb * model.vocab / tp
    return inputs + logits
