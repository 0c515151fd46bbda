"""The single-process reference for --check: the same model, the full batch, one backward."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from .models import PipelineModel

TOLERANCE = 1e-4  # relative, fp32: microbatching only reorders sums (errors ~1e-6)


@dataclass(frozen=True, eq=False)
class Reference:
    loss: float
    grads: dict[str, Tensor]  # parameter name (as in PipelineModel.units) -> gradient


def compute(model: PipelineModel, device: torch.device) -> Reference:
    """Loss and every parameter's gradient of `model` on its full batch, on a copy of it."""
    full = copy.deepcopy(model.full_module()).to(device)
    loss = model.loss(full(model.inputs.to(device)), model.targets.to(device))
    loss.backward()
    grads = {
        name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach()
        for name, p in full.named_parameters()
        if p.requires_grad
    }
    return Reference(float(loss.detach()), grads)


def relative_error(got: Tensor | None, want: Tensor) -> float:
    """max |got - want| / max |want| (a missing gradient counts as zeros)."""
    got = torch.zeros_like(want) if got is None else got.detach()
    scale = want.abs().max().item()
    diff = (got.to(want.dtype) - want).abs().max().item()
    if scale == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / scale
