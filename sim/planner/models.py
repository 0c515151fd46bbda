"""Decoder-only transformer descriptions: presets with published dimensions, and HF config.json files.

A `Transformer` holds what the planner's closed forms need (sim.planner.flops,
sim.planner.memory): layers, hidden size, attention and key/value heads, FFN size,
vocabulary, sequence length, dtype, and the architectural switches that change the
parameter count (gated FFN, biases, norm kind, learned positions, tied embeddings).

Presets and their sources:

- ``gpt3-175b``: Brown et al. 2020 (96 layers, hidden 12288, 96 heads, 2048 tokens), with the
  vocabulary padded to 51,200 as Megatron-LM runs it (Narayanan et al. SC'21 §5.1).
- ``megatron-*``: the GPT family of Narayanan et al. SC'21 Table 1 (vocabulary 51,200,
  sequence 2048; 1.7B ... 1008B), plus the models of its Figures 13-15 (161B: 32 layers,
  hidden 20480, 128 heads; 5.9B: 32 layers, hidden 3840, 32 heads) and the 22B model of
  Korthikanti et al. 2022 (48 layers, hidden 6144, 64 heads).
- ``llama2-7b/13b/70b``: Touvron et al. 2023 (Llama 2) and the released config.json files
  (SwiGLU FFN 11008 / 13824 / 28672, 70B with 8 key/value heads, vocabulary 32000, 4096 tokens).
- ``llama3-8b/70b/405b``: Llama Team 2024, "The Llama 3 Herd of Models", Table 3 (layers
  32/80/126, model dimension 4096/8192/16384, FFN 14336/28672/53248, heads 32/64/128,
  8 key/value heads, vocabulary 128,256 in the released tokenizer, 8192 tokens).
- ``bloom-176b``: BigScience 2022 (70 layers, hidden 14336, 112 heads, vocabulary 250,880,
  ALiBi: no position parameters, a layer norm after the embedding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import PlanError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer (fields above; sizes are counts, `dtype_bytes` per value).

    `gated`: SwiGLU-style FFN with three matrices (gate, up, down) instead of two;
    `norm`: "layernorm" (weight and bias) or "rmsnorm" (weight only); `bias`: linear
    layers carry biases; `learned_positions`: a position table of seq_len x hidden;
    `tied_embeddings`: the LM head reuses the input embedding; `head_bias`: the LM
    head has a bias; `embedding_norm`: a norm right after the embedding (BLOOM);
    `dropout`: the layers keep dropout masks for the backward (GPT-style training).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    gated: bool = False
    norm: str = "layernorm"
    bias: bool = True
    learned_positions: bool = True
    tied_embeddings: bool = True
    head_bias: bool = False
    embedding_norm: bool = False
    dropout: bool = True
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len", "dtype_bytes"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if not isinstance(self.kv_heads, int) or self.kv_heads < 1 or self.heads % self.kv_heads:
            raise PlanError(f"model {self.name!r}: kv_heads {self.kv_heads!r} must divide heads {self.heads}")
        if self.hidden % self.heads:
            raise PlanError(f"model {self.name!r}: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise PlanError(f"model {self.name!r}: norm must be layernorm or rmsnorm, got {self.norm!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    def with_seq_len(self, seq_len: int) -> "Transformer":
        return replace(self, seq_len=seq_len)


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq_len: int = 2048) -> Transformer:
    """A GPT-2/3 style model as Megatron-LM trains it (4h GELU FFN, biases, learned positions, tied)."""
    return Transformer(name, layers, hidden, heads, 4 * hidden, vocab, seq_len)


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
           seq_len: int) -> Transformer:
    """A Llama model: SwiGLU FFN, RMSNorm, rotary positions, no biases, untied head, no dropout."""
    return Transformer(name, layers, hidden, heads, ffn, vocab, seq_len, kv_heads=kv_heads, gated=True,
                       norm="rmsnorm", bias=False, learned_positions=False, tied_embeddings=False, dropout=False)


PRESETS: dict[str, Transformer] = {
    m.name: m
    for m in (
        _gpt("gpt3-175b", 96, 12288, 96),
        _gpt("megatron-1.7b", 24, 2304, 24),
        _gpt("megatron-3.6b", 30, 3072, 32),
        _gpt("megatron-5.9b", 32, 3840, 32),
        _gpt("megatron-7.5b", 36, 4096, 32),
        _gpt("megatron-18.4b", 40, 6144, 48),
        _gpt("megatron-22b", 48, 6144, 64),
        _gpt("megatron-39.1b", 48, 8192, 64),
        _gpt("megatron-76.1b", 60, 10240, 80),
        _gpt("megatron-145.6b", 80, 12288, 96),
        _gpt("megatron-161b", 32, 20480, 128),
        _gpt("megatron-310.1b", 96, 16384, 128),
        _gpt("megatron-529.6b", 105, 20480, 128),
        _gpt("megatron-1008b", 128, 25600, 160),
        _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        Transformer("bloom-176b", 70, 14336, 112, 4 * 14336, 250880, 2048, learned_positions=False,
                    embedding_norm=True),
    )
}


def preset(name: str) -> Transformer:
    """The preset called `name`; PlanError listing the presets if there is none."""
    try:
        return PRESETS[name]
    except KeyError:
        raise PlanError(f"unknown model {name!r}: give a config.json file or one of {', '.join(PRESETS)}") from None


def from_config(data: dict[str, Any], name: str = "config") -> Transformer:
    """A Transformer from a HuggingFace-style config dict (GPT-2 or Llama keys); PlanError if neither."""
    if not isinstance(data, dict):
        raise PlanError(f"{name}: a model config is a JSON object, got {type(data).__name__}")
    dtype = DTYPE_BYTES.get(str(data.get("torch_dtype", "bfloat16")), 2)
    try:
        if "n_layer" in data:
            hidden = data["n_embd"]
            return Transformer(
                name, data["n_layer"], hidden, data["n_head"], data.get("n_inner") or 4 * hidden,
                data["vocab_size"], data.get("n_positions", data.get("n_ctx", 1024)),
                tied_embeddings=bool(data.get("tie_word_embeddings", True)), dtype_bytes=dtype,
            )
        if "num_hidden_layers" in data:
            heads = data["num_attention_heads"]
            return Transformer(
                name, data["num_hidden_layers"], data["hidden_size"], heads, data["intermediate_size"],
                data["vocab_size"], data.get("max_position_embeddings", 4096),
                kv_heads=data.get("num_key_value_heads") or heads, gated=True, norm="rmsnorm",
                bias=bool(data.get("attention_bias", False)), learned_positions=False,
                tied_embeddings=bool(data.get("tie_word_embeddings", False)), dropout=False, dtype_bytes=dtype,
            )
    except KeyError as exc:
        raise PlanError(f"{name}: model config lacks the key {exc.args[0]!r}") from None
    raise PlanError(
        f"{name}: not a model config (expected GPT-2 keys n_layer/n_embd/n_head/vocab_size or Llama keys "
        "num_hidden_layers/hidden_size/intermediate_size/num_attention_heads/vocab_size)"
    )


def load_model(spec: str) -> Transformer:
    """A preset name, or the path of a config.json; PlanError naming what is wrong."""
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.suffix and not path.exists():
        return preset(spec)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise PlanError(f"cannot read model config {spec}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"model config {spec} is not valid JSON: {exc}") from None
    return from_config(data, name=path.stem if path.stem != "config" else path.parent.name or "config")
