"""One parallel configuration, the axes a search may vary, and which combinations are legal.

A `Config` fixes every axis: data (d), tensor (t) and pipeline (p) parallel sizes, the
pipeline schedule and its stages per rank (v), the microbatch size b (sequences) and count
m, the ZeRO stage, activation recomputation and sequence parallelism. `Space` says which
values each axis may take; `enumerate_configs` lists every combination that the closed-form
rules below allow (a schedule generator may still refuse a size when it is built, e.g.
interleaved needs m to be a multiple of p; the search drops those then).

Rules: t x p x d = GPUs; the global batch B = d x b x m; t divides the attention heads
and the FFN width and, unless allowed, stays inside a node (t divides the GPUs per node);
key/value heads are split by t or replicated (one divides the other); every stage holds
at least one layer (p x v <= layers); a single pipeline rank (p = 1) runs only
schedules with one stage per rank and a fused backward (there is no pipeline to fill, the
others add nothing); sequence parallelism needs t > 1; a ZeRO stage above 0
needs d > 1 (with d = 1 it changes nothing); the zero-bubble family (split backward) does
not combine with full recomputation (W needs what I computes, so recomputing in I would
keep it anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import schedules

from .axes import RECOMPUTE
from .errors import PlanError
from .models import Transformer

SPLIT_BACKWARD = ("zb-h1", "zb-h2", "zbv")  # schedules that run I and W apart
DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
DEFAULT_CHUNKS = (2, 3, 4, 6, 8)


@dataclass(frozen=True)
class Config:
    """A full parallel configuration (see the module docstring)."""

    tp: int
    pp: int
    dp: int
    schedule: str
    chunks: int
    microbatch_size: int
    microbatches: int
    zero: int
    recompute: str
    sequence_parallel: bool

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def split_backward(self) -> bool:
        return self.schedule in SPLIT_BACKWARD

    @property
    def num_stages(self) -> int:
        return self.pp * self.chunks

    def key(self) -> tuple:
        """A total order used to break ties deterministically."""
        return (self.tp, self.pp, self.dp, self.schedule, self.chunks, self.microbatch_size, self.zero,
                RECOMPUTE.index(self.recompute), self.sequence_parallel)

    def describe(self) -> str:
        v = f" v={self.chunks}" if self.chunks > 1 else ""
        sp = " sp" if self.sequence_parallel else ""
        return (f"t={self.tp} p={self.pp} d={self.dp} {self.schedule}{v} b={self.microbatch_size} "
                f"m={self.microbatches} zero={self.zero} recompute={self.recompute}{sp}")

    def record(self) -> dict:
        """The configuration's JSON keys."""
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "schedule": self.schedule, "chunks": self.chunks,
            "microbatch_size": self.microbatch_size, "microbatches": self.microbatches, "zero": self.zero,
            "recompute": self.recompute, "sequence_parallel": self.sequence_parallel,
        }


@dataclass(frozen=True)
class Space:
    """Allowed values per axis; None means every value the rules allow."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    dp: tuple[int, ...] | None = None
    schedules: tuple[str, ...] | None = None
    chunks: tuple[int, ...] | None = None
    microbatch_sizes: tuple[int, ...] | None = None
    zero: tuple[int, ...] | None = None
    recompute: tuple[str, ...] | None = None
    sequence_parallel: tuple[bool, ...] | None = None
    cross_node_tp: bool = False

    def check(self) -> None:
        """PlanError naming the first unknown schedule, ZeRO stage or recompute mode."""
        for name in self.schedules or ():
            if name not in schedules.available():
                raise PlanError(f"unknown schedule {name!r}; available: {', '.join(schedules.available())}")
        for stage in self.zero or ():
            if stage not in (0, 1, 2, 3):
                raise PlanError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
        for mode in self.recompute or ():
            if mode not in RECOMPUTE:
                raise PlanError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {mode!r}")


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _allowed(values: Sequence | None, default: Sequence) -> list:
    return list(default) if values is None else [x for x in default if x in values]


def enumerate_configs(model: Transformer, gpus: int, gpus_per_node: int, global_batch: int,
                      space: Space) -> Iterator[Config]:
    """Every configuration the closed-form rules allow, in a fixed order."""
    space.check()
    names = list(space.schedules) if space.schedules is not None else schedules.available()
    tp_default = [t for t in divisors(gpus) if (space.cross_node_tp or gpus_per_node % t == 0)]
    for t in _allowed(space.tp, tp_default):
        if model.heads % t or model.ffn_hidden % t or (model.kv_heads % t and t % model.kv_heads):
            continue
        for p in _allowed(space.pp, divisors(gpus // t)):
            d = gpus // (t * p)
            if p > model.layers or (space.dp is not None and d not in space.dp) or global_batch % d:
                continue
            per_replica = global_batch // d
            sizes = space.microbatch_sizes if space.microbatch_sizes is not None else DEFAULT_MICROBATCH_SIZES
            for b in [b for b in sizes if per_replica % b == 0]:
                m = per_replica // b
                for name in names:
                    if p == 1 and name in SPLIT_BACKWARD:
                        continue
                    for v in _chunk_values(name, p, model.layers, space.chunks):
                        for zero in _allowed(space.zero, (0, 1, 2, 3) if d > 1 else (0,)):
                            for recompute in _allowed(space.recompute, RECOMPUTE):
                                if recompute == "full" and name in SPLIT_BACKWARD:
                                    continue
                                for sp in _allowed(space.sequence_parallel, (False, True) if t > 1 else (False,)):
                                    yield Config(t, p, d, name, v, b, m, zero, recompute, sp)


def _chunk_values(name: str, p: int, layers: int, chunks: Sequence[int] | None) -> list[int]:
    """Stages per rank to try for schedule `name` at p ranks: its fixed count, or (for schedules
    that take one) each requested value, by default DEFAULT_CHUNKS; every stage keeps a layer.
    `chunks` does not restrict schedules with a fixed count."""
    fixed = schedules.generator(name).chunks
    if fixed is not None:
        return [fixed] if p * fixed <= layers and (fixed == 1 or p > 1) else []
    low = schedules.generator(name).min_chunks
    if chunks is not None:
        return [v for v in chunks if v >= low and p * v <= layers]
    return [v for v in DEFAULT_CHUNKS if v >= low and p * v <= layers and p > 1]
