"""Cluster descriptions: GPU presets, the two link levels, nodes x GPUs per node.

GPU presets (datasheet numbers, dense BF16 tensor-core peak without sparsity):

- ``a100-80g``: NVIDIA A100 80GB SXM: 312 TFLOP/s, 80 GB HBM2e at 2.039 TB/s; NVLink 3
  600 GB/s per GPU (both directions; 300 GB/s each way); DGX A100 nodes carry one 200 Gb/s
  HDR InfiniBand adapter per GPU (25 GB/s).
- ``h100-sxm``: NVIDIA H100 SXM5 80GB: 989 TFLOP/s, 80 GB HBM3 at 3.35 TB/s; NVLink 4
  900 GB/s per GPU (450 GB/s each way); DGX H100: one 400 Gb/s NDR adapter per GPU (50 GB/s).
- ``h200``: NVIDIA H200 SXM 141GB: 989 TFLOP/s, 141 GB HBM3e at 4.8 TB/s; NVLink and
  InfiniBand as H100.

Link latencies (alpha of T = alpha + N / BW, per hop of a ring) are not on datasheets:
5 us inside a node and 10 us between nodes are this module's assumptions, typical of NCCL's
small-message times; override them when you have measurements.

`gemm_efficiency` is the achieved fraction of peak in GEMMs (sim.planner.throughput). Its
default for every preset, 0.569, was fitted once, with `throughput.fit_efficiency`
(`python bench/plan_validate.py --fit` reproduces it), to one published measurement: the 22B
model of Korthikanti et al. 2022 on one DGX A100 (t=8, p=1, d=1, batch 4, microbatch 1,
selective recomputation, sequence parallel: 41.5% MFU, Megatron-LM README).
That case involves no pipeline and no data parallelism, so what it fits is per-GPU
compute; the validation table (README) lists it as the fitting case and keeps it out of the
error statistics. The H100 and H200 presets reuse the same fraction: no single-node
measurement of theirs was found to fit one on, which the Llama 3 rows of the validation show.

`usable_memory` is the share of a GPU's memory the plan may fill (default 0.9): the CUDA
context, NCCL's buffers and allocator fragmentation take the rest.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PlanError

GB = 1e9


@dataclass(frozen=True)
class Link:
    """One level of interconnect, per GPU: bandwidth each way (bytes/s) and per-hop latency (s)."""

    bandwidth: float
    latency: float


@dataclass(frozen=True)
class Gpu:
    """A GPU: peak dense 16-bit FLOP/s, memory bytes, HBM bandwidth (bytes/s), achieved GEMM fraction."""

    name: str
    peak_flops: float
    memory: float
    hbm_bandwidth: float
    gemm_efficiency: float = 0.569


@dataclass(frozen=True)
class Cluster:
    """`nodes` x `gpus_per_node` GPUs; `intra` links inside a node, `inter` between nodes."""

    gpu: Gpu
    nodes: int
    gpus_per_node: int
    intra: Link
    inter: Link
    usable_memory: float = 0.9

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def memory_cap(self) -> float:
        """Bytes per GPU a plan may use."""
        return self.gpu.memory * self.usable_memory

    def link(self, intra_node: bool) -> Link:
        return self.intra if intra_node else self.inter


GPUS: dict[str, Gpu] = {
    g.name: g
    for g in (
        Gpu("a100-80g", 312e12, 80 * GB, 2.039e12),
        Gpu("h100-sxm", 989e12, 80 * GB, 3.35e12),
        Gpu("h200", 989e12, 141 * GB, 4.8e12),
    )
}

LINKS: dict[str, tuple[Link, Link]] = {
    "a100-80g": (Link(300 * GB, 5e-6), Link(25 * GB, 10e-6)),
    "h100-sxm": (Link(450 * GB, 5e-6), Link(50 * GB, 10e-6)),
    "h200": (Link(450 * GB, 5e-6), Link(50 * GB, 10e-6)),
}

# Keys a cluster JSON file (or override) may set; GB-valued for the human-facing ones.
OVERRIDES = {
    "peak_tflops": "TFLOP/s", "memory_gb": "GB", "hbm_gbps": "GB/s", "gemm_efficiency": "fraction",
    "intra_gbps": "GB/s", "intra_latency_us": "us", "inter_gbps": "GB/s", "inter_latency_us": "us",
    "usable_memory": "fraction",
}


def make_cluster(gpu: str, gpus: int, gpus_per_node: int, overrides: dict[str, float] | None = None) -> Cluster:
    """A cluster of `gpus` GPUs of preset `gpu`, `gpus_per_node` per node, with `overrides`
    (keys of OVERRIDES); PlanError for an unknown preset, a bad count or a bad override."""
    if gpu not in GPUS:
        raise PlanError(f"unknown GPU {gpu!r}; presets: {', '.join(GPUS)}")
    for label, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node)):
        if not isinstance(value, int) or value < 1:
            raise PlanError(f"{label} must be a positive integer, got {value!r}")
    if gpus % gpus_per_node:
        raise PlanError(f"{gpus} GPUs do not fill whole nodes of {gpus_per_node} GPUs")
    base = GPUS[gpu]
    intra, inter = LINKS[gpu]
    cluster = Cluster(base, gpus // gpus_per_node, gpus_per_node, intra, inter)
    return apply_overrides(cluster, overrides or {})


def apply_overrides(cluster: Cluster, overrides: dict[str, Any]) -> Cluster:
    """The cluster with each given number replaced (units in OVERRIDES); PlanError for unknown keys."""
    unknown = sorted(set(overrides) - set(OVERRIDES))
    if unknown:
        raise PlanError(f"unknown cluster key(s) {', '.join(unknown)}; known: {', '.join(OVERRIDES)}")
    values = {}
    for key, value in overrides.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise PlanError(f"cluster key {key} must be a number > 0, got {value!r}")
        values[key] = float(value)
    for key in ("gemm_efficiency", "usable_memory"):
        if values.get(key, 0) > 1:
            raise PlanError(f"cluster key {key} is a fraction within (0, 1], got {values[key]}")
    gpu = cluster.gpu
    gpu = dataclasses.replace(
        gpu,
        peak_flops=values.get("peak_tflops", gpu.peak_flops / 1e12) * 1e12,
        memory=values.get("memory_gb", gpu.memory / GB) * GB,
        hbm_bandwidth=values.get("hbm_gbps", gpu.hbm_bandwidth / GB) * GB,
        gemm_efficiency=values.get("gemm_efficiency", gpu.gemm_efficiency),
    )
    intra = Link(values.get("intra_gbps", cluster.intra.bandwidth / GB) * GB,
                 values.get("intra_latency_us", cluster.intra.latency * 1e6) * 1e-6)
    inter = Link(values.get("inter_gbps", cluster.inter.bandwidth / GB) * GB,
                 values.get("inter_latency_us", cluster.inter.latency * 1e6) * 1e-6)
    return dataclasses.replace(cluster, gpu=gpu, intra=intra, inter=inter,
                               usable_memory=values.get("usable_memory", cluster.usable_memory))


def load_overrides(path: str | Path) -> dict[str, Any]:
    """A cluster JSON file: an object of OVERRIDES keys; PlanError if unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanError(f"cannot read cluster file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"cluster file {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"cluster file {path} must hold a JSON object of {', '.join(OVERRIDES)}")
    return data
