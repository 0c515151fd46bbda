"""The achieved-throughput model: how long a GPU takes for a piece of work.

Two terms, each from one property of the GPU:

- GEMMs (and the attention core's batched GEMMs) run at ``gemm_efficiency x peak``, one
  fraction per GPU preset (sim.planner.cluster documents its default and its source);
- the element-wise work between them (norms, softmax, activation functions, dropout,
  residual adds) is bound by HBM bandwidth. Its traffic is counted from the activations the
  layer keeps (sim.planner.memory): in the forward pass each kept tensor is written once;
  the backward pass reads it and writes its gradient, twice the forward's traffic.

So a stage's forward time is GEMM FLOPs / (efficiency x peak) + forward traffic / HBM
bandwidth; the backward's input part (I) adds the GEMM input gradients, twice the attention
core and twice the traffic; the weight part (W) the weight-gradient GEMMs. Tensor-parallel
collectives come on top (sim.planner.stage_costs). `fit_efficiency` finds the efficiency
that makes a configuration's predicted step time equal a measured one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .cluster import Gpu
from .errors import PlanError


@dataclass(frozen=True)
class Throughput:
    """Seconds per FLOP of GEMM and per byte of element-wise traffic on one GPU."""

    peak_flops: float
    gemm_efficiency: float
    hbm_bandwidth: float

    @classmethod
    def of(cls, gpu: Gpu) -> "Throughput":
        return cls(gpu.peak_flops, gpu.gemm_efficiency, gpu.hbm_bandwidth)

    def gemm(self, flops: float) -> float:
        """Seconds for `flops` FLOPs of GEMM."""
        return flops / (self.peak_flops * self.gemm_efficiency)

    def traffic(self, num_bytes: float) -> float:
        """Seconds to stream `num_bytes` through HBM (element-wise kernels)."""
        return num_bytes / self.hbm_bandwidth


def fit_efficiency(step_time: Callable[[float], float], measured: float, low: float = 0.05,
                   high: float = 1.0, tolerance: float = 1e-4) -> float:
    """The GEMM efficiency e in [low, high] with step_time(e) = measured (bisection: the step
    time falls as e rises). PlanError if the measurement lies outside what [low, high] gives."""
    slowest, fastest = step_time(low), step_time(high)
    if not fastest <= measured <= slowest:
        raise PlanError(
            f"a measured step of {measured:.4g} s is outside what efficiencies {low}..{high} predict "
            f"({fastest:.4g}..{slowest:.4g} s)"
        )
    while high - low > tolerance:
        mid = (low + high) / 2
        if step_time(mid) > measured:
            low = mid
        else:
            high = mid
    return (low + high) / 2
