"""Parameter counts and FLOPs of a `Transformer`, in closed form.

Parameters, per layer: attention Q and O (h x h each), K and V (h x kv_dim each), the FFN
(two h x f matrices, three when gated), their biases if any, and two norms (2h each for
LayerNorm, h for RMSNorm). Outside the layers: the token embedding (V x h), a learned
position table (s x h), a norm after the embedding (BLOOM), the final norm, and an untied
LM head (V x h, plus V with a bias). For the GPT models this is Narayanan et al. (SC'21)
eq. (2), P = 12lh^2 (1 + 13/(12h) + (V + s)/(12lh)), plus the final norm's 2h that eq. (2)
leaves out.

FLOPs (a multiply-add is 2 FLOPs; the convention of Narayanan et al. SC'21, Appendix, and
Korthikanti et al. 2022 §6): per layer and forward pass of b sequences of s tokens, every
GEMM costs 2 b s x (its weights), and the attention core (Q K^T and the product with V)
costs 4 b s^2 h, counted over the full s x s score matrix as Megatron-LM counts it. The LM
head costs 2 b s h V. A backward pass costs twice its forward: the input gradients (I)
repeat every GEMM and twice the attention core, the weight gradients (W) repeat every GEMM.
So one iteration of B sequences costs

    model FLOPs = 72 B s l h^2 (1 + s/(6h) + V/(12 l h))            (GPT models)

(Korthikanti et al. 2022, the count behind MFU: no recomputation), and with full activation
recomputation the layers' forward runs twice:

    hardware FLOPs = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))         (SC'21 eq. 3)

Selective recomputation (Korthikanti et al.) repeats only the attention core's forward.
`six_nd` is the 6 N D estimate of training compute (Kaplan et al. 2020; Hoffmann et al. 2022).
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import Transformer


def norm_params(model: Transformer) -> int:
    """Parameters of one norm layer."""
    return 2 * model.hidden if model.norm == "layernorm" else model.hidden


def layer_matmul_params(model: Transformer) -> int:
    """Weights of one layer's GEMMs (Q, K, V, O and the FFN), without biases."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_dim
    attention = 2 * h * h + 2 * h * kv
    ffn = (3 if model.gated else 2) * h * f
    return attention + ffn


def layer_params(model: Transformer) -> int:
    """All parameters of one transformer layer."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_dim
    biases = 0
    if model.bias:
        biases = h + 2 * kv + h + ((2 * f) if model.gated else f) + h
    return layer_matmul_params(model) + biases + 2 * norm_params(model)


def embedding_params(model: Transformer) -> int:
    """Token embedding, learned positions and an embedding norm: what the first stage holds besides layers."""
    params = model.vocab * model.hidden
    if model.learned_positions:
        params += model.seq_len * model.hidden
    if model.embedding_norm:
        params += norm_params(model)
    return params


def head_params(model: Transformer) -> int:
    """Final norm and the LM head: what the last stage holds besides layers (a tied head is the
    embedding's matrix, counted once in the model and held by both end stages)."""
    params = norm_params(model)
    if not model.tied_embeddings:
        params += model.vocab * model.hidden
    if model.head_bias:
        params += model.vocab
    return params


def parameters(model: Transformer) -> int:
    """Total parameter count."""
    return model.layers * layer_params(model) + embedding_params(model) + head_params(model)


@dataclass(frozen=True)
class ForwardFlops:
    """Forward FLOPs of one microbatch (b sequences), whole model width (before tensor parallelism).

    `gemm`: one layer's GEMMs; `core`: one layer's attention core (Q K^T, scores x V);
    `head`: the LM head GEMM.
    """

    gemm: float
    core: float
    head: float


def forward_flops(model: Transformer, sequences: int) -> ForwardFlops:
    """Forward FLOPs of `sequences` sequences of model.seq_len tokens."""
    tokens = sequences * model.seq_len
    return ForwardFlops(
        gemm=2.0 * tokens * layer_matmul_params(model),
        core=4.0 * tokens * model.seq_len * model.hidden,
        head=2.0 * tokens * model.hidden * model.vocab,
    )


def model_flops(model: Transformer, sequences: int) -> float:
    """FLOPs of one training iteration over `sequences` sequences, recomputation not counted (MFU's numerator)."""
    f = forward_flops(model, sequences)
    return 3.0 * (model.layers * (f.gemm + f.core) + f.head)


def hardware_flops(model: Transformer, sequences: int, recompute: str) -> float:
    """FLOPs actually executed: model FLOPs plus the recomputed forward ("none", "selective", "full")."""
    f = forward_flops(model, sequences)
    extra = {"none": 0.0, "selective": f.core, "full": f.gemm + f.core}[recompute]
    return model_flops(model, sequences) + model.layers * extra


def six_nd(params: float, tokens: float) -> float:
    """Training compute estimate 6 N D (Kaplan et al. 2020)."""
    return 6.0 * params * tokens
