"""One pipeline stage on its rank: forward, full backward, and split backward (I then W).

A stage keeps, per microbatch in flight, the input leaf and the output (or, on the last
stage, the weighted loss) that backward starts from. The last stage weights each
microbatch's loss by its share of the batch, so the summed gradients equal the
full-batch gradient of a mean-reduced loss.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from .memory import SavedTensorMeter
from .split import SplitRecord, WeightDeferral, backward_weight


class Stage:
    """Runs the compute actions of one stage; tensors move between stages as plain tensors."""

    def __init__(
        self,
        index: int,
        module: nn.Module,
        meter: SavedTensorMeter,
        loss: Callable[[Tensor, Tensor], Tensor] | None = None,
        targets: list[Tensor] | None = None,
        weights: list[float] | None = None,
        split: bool = False,
    ):
        self.index = index
        self.module = module
        self.meter = meter
        self.loss = loss  # set on the last stage only
        self.targets = targets
        self.weights = weights
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.deferral = WeightDeferral(module, meter) if split else None
        self._inputs: dict[int, Tensor | None] = {}
        self._outputs: dict[int, Tensor] = {}
        self._records: dict[int, SplitRecord] = {}
        self.loss_sum: Tensor | None = None

    @property
    def is_last(self) -> bool:
        return self.loss is not None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.loss_sum = None

    def forward(self, mb: int, x: Tensor, split: bool) -> Tensor | None:
        """F: run the stage; returns the output to hand on (None on the last stage)."""
        if self.index > 0 and x.is_floating_point():
            x = x.detach().requires_grad_(True)
            self._inputs[mb] = x
        else:
            self._inputs[mb] = None
        record = None
        if split:
            record = SplitRecord()
            self._records[mb] = record
            self.deferral.record(record)
        try:
            with self.meter.hooks():
                out = self.module(x)
                if self.loss is not None:
                    out = self.loss(out, self.targets[mb]) * self.weights[mb]
        finally:
            if split:
                self.deferral.record(None)
        self._outputs[mb] = out
        if self.loss is not None:
            value = out.detach()
            self.loss_sum = value if self.loss_sum is None else self.loss_sum + value
            return None
        return out.detach()

    def backward(self, mb: int, grad: Tensor | None) -> Tensor | None:
        """B: gradients for the input and the weights; returns the input gradient."""
        out = self._outputs.pop(mb)
        x = self._inputs.pop(mb)
        torch.autograd.backward(out, grad)
        return None if x is None else x.grad

    def backward_input(self, mb: int, grad: Tensor | None) -> Tensor | None:
        """I: gradient for the input only (the weights' wait in the split record)."""
        out = self._outputs.pop(mb)
        x = self._inputs.pop(mb)
        record = self._records[mb]
        inputs = [self.deferral.anchor, *record.loose.values()]
        if x is not None:
            inputs.append(x)
        torch.autograd.backward(out, grad, inputs=inputs)
        return None if x is None else x.grad

    def backward_weight(self, mb: int) -> None:
        """W: the weight gradients that I left for later."""
        backward_weight(self._records.pop(mb))

    def close(self) -> None:
        if self.deferral is not None:
            self.deferral.restore()
