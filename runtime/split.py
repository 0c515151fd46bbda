"""Split backward: I (gradients for the stage input) now, W (gradients for the weights) later.

How: during a forward whose backward will be split, every module that owns parameters
directly (the outermost such module on each path: Linear, LayerNorm, Embedding, ...)
runs inside a bridge. The bridge computes the module on a detached copy of its input,
so the module's own graph (which reaches its parameters) hangs off the bridge and not
off the stage's main graph. The main graph links bridges only through their inputs.

- I runs backward over the main graph to the stage input. Each bridge on the way
  receives its output gradient dy, stores it, and returns dx through the module's own
  graph (kept, since W needs it). The main graph is freed as usual, so the activations
  only I needed (e.g. ReLU masks, attention probabilities) are released.
- W, for each bridge, backpropagates the stored dy from the module's output edge to its
  parameters and frees that graph. What survives from I to W is exactly what weight
  gradients need: each parametric module's saved input (plus its own small state, e.g.
  LayerNorm's mean and rstd) and the dy at its output.

This is the zero-bubble paper's split (Qi et al., ICLR 2024, section 2), done at module
granularity; torch.distributed.pipelining's `stage_backward_input/weight` instead keeps
the whole graph alive until W. A parametric module called with anything but one tensor
argument is not bridged: its parameter gradients are then computed during I.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge

from .errors import ConfigError


class Deferred:
    """One bridged module call: its output edge, its parameters and, after I, its dy."""

    __slots__ = ("params", "edge", "output", "input", "grad")

    def __init__(self, params: tuple[nn.Parameter, ...]):
        self.params = params
        self.edge = None
        self.output: Tensor | None = None  # held only until I
        self.input: Tensor | None = None  # the detached input, held only until I
        self.grad: Tensor | None = None


class _Bridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor: Tensor, x: Tensor, call: Callable[[Tensor], Tensor], deferred: Deferred) -> Tensor:
        wants_dx = ctx.needs_input_grad[1]
        with torch.enable_grad():
            inner = x.detach().requires_grad_(wants_dx)
            y = call(inner)
        if not isinstance(y, Tensor) or not y.requires_grad:
            raise ConfigError(
                "split backward (I/W) needs every parametric module to return one tensor that "
                f"depends on its parameters; {getattr(call, '__self__', call).__class__.__name__} does not"
            )
        deferred.output = y
        deferred.input = inner if wants_dx else None
        deferred.edge = get_gradient_edge(y)
        ctx.deferred = deferred
        return y.detach()

    @staticmethod
    def backward(ctx, dy: Tensor):
        deferred: Deferred = ctx.deferred
        deferred.grad = dy
        dx = None
        if deferred.input is not None:
            (dx,) = torch.autograd.grad(
                deferred.output, deferred.input, dy, retain_graph=True, allow_unused=True
            )
        deferred.output = None
        deferred.input = None
        return None, dx, None, None


@dataclass
class SplitRecord:
    """What one microbatch's split forward left for I and W."""

    deferred: list[Deferred] = field(default_factory=list)
    loose: dict[int, nn.Parameter] = field(default_factory=dict)  # params of unbridged calls


class WeightDeferral:
    """Bridges the parametric modules of one stage module; inactive unless recording."""

    def __init__(self, module: nn.Module):
        # A leaf that every bridge takes as input, so that I reaches every bridge even
        # when the module input needs no gradient (stage 0, token ids).
        self.anchor = torch.empty(0, requires_grad=True)
        self._record: SplitRecord | None = None
        self._patched: list[nn.Module] = []
        for mod in _outermost_parametric(module):
            mod.forward = self._bridged(mod, mod.forward)
            self._patched.append(mod)

    def record(self, record: SplitRecord | None) -> None:
        """Bridge the calls of the following forward into `record` (None: run plainly)."""
        self._record = record

    def restore(self) -> None:
        """Give the modules back their own forward."""
        for mod in self._patched:
            del mod.forward
        self._patched.clear()

    def _bridged(self, mod: nn.Module, original: Callable) -> Callable:
        params = tuple(p for p in mod.parameters() if p.requires_grad)

        def forward(*args, **kwargs):
            record = self._record
            if record is None:
                return original(*args, **kwargs)
            if kwargs or len(args) != 1 or not isinstance(args[0], Tensor):
                for p in params:
                    record.loose[id(p)] = p
                return original(*args, **kwargs)
            deferred = Deferred(params)
            self._record = None  # modules inside this one run plainly within the bridge
            try:
                out = _Bridge.apply(self.anchor, args[0], original, deferred)
            finally:
                self._record = record
            record.deferred.append(deferred)
            return out

        return forward


def backward_weight(record: SplitRecord) -> None:
    """W: accumulate the parameter gradients of every bridged call, freeing its graph."""
    for deferred in record.deferred:
        if deferred.grad is None:  # the module's output did not reach the loss
            continue
        grads = torch.autograd.grad(
            [deferred.edge], deferred.params, grad_outputs=[deferred.grad], allow_unused=True
        )
        for param, grad in zip(deferred.params, grads):
            if grad is None:
                continue
            if param.grad is None:
                param.grad = grad
            else:
                param.grad.add_(grad)
        deferred.edge = None
        deferred.grad = None
    record.deferred.clear()


def _outermost_parametric(module: nn.Module) -> list[nn.Module]:
    """Modules owning a trainable parameter directly, none inside another such module."""
    found: list[nn.Module] = []

    def visit(mod: nn.Module) -> None:
        if any(p.requires_grad for p in mod.parameters(recurse=False)):
            found.append(mod)
            return
        for child in mod.children():
            visit(child)

    visit(module)
    return found
