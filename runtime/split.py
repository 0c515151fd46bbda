"""Split backward: I (gradients for the stage input) now, W (gradients for the weights) later.

During a forward whose backward will be split, every module that owns parameters
directly (the outermost such module on each path: Linear, LayerNorm, Embedding, ...)
runs behind a custom autograd function, a *bridge*, that keeps its weight gradient out
of the stage's main graph:

- ``nn.Linear`` (the bulk of the weights): the bridge computes ``y = x W^T + b`` and,
  in I, returns ``dx = dy W`` only. It keeps ``x`` and ``dy``; W later computes
  ``dW = dy^T x`` and ``db = sum(dy)``. No autograd graph survives I.
- ``nn.LayerNorm``: likewise with aten's layer-norm kernels, keeping ``x``, the row
  means and reciprocal deviations, and ``dy``; I asks the backward kernel for ``dx``
  only, W for the weight and bias gradients only.
- any other parametric module: the bridge runs the module on a detached copy of its
  input, so the module's own graph (which reaches its parameters) hangs off the bridge.
  In I the bridge receives ``dy``, returns ``dx`` through that graph (kept, since W
  needs it) and W backpropagates ``dy`` from the module's output to its parameters.

I runs backward over the main graph to the stage input and frees it as usual, so the
activations only input gradients need (ReLU masks, attention probabilities) are gone
after I. What survives from I to W is what weight gradients need: each parametric
module's input and the ``dy`` at its output, plus small per-module state (LayerNorm's
statistics; for the generic path, whatever the module's own graph saved). These are
counted by the memory meter until W releases them. This is the zero-bubble split (Qi et
al., ICLR 2024, section 2) at module granularity; torch.distributed.pipelining's
``stage_backward_input`` instead runs I with ``retain_graph=True``, keeping the stage's
whole graph alive until W. A parametric module called with anything
but one tensor argument is not bridged: its parameter gradients are computed in I.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge

from .errors import ConfigError
from .memory import SavedTensorMeter, unpack


class LinearDeferred:
    """A bridged nn.Linear call: its input and, after I, its output gradient (both metered)."""

    __slots__ = ("weight", "bias", "input", "grad")

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None):
        self.weight = weight
        self.bias = bias
        self.input = None
        self.grad = None

    def backward_weight(self) -> None:
        x, dy = unpack(self.input), unpack(self.grad)
        x2 = x.reshape(-1, x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])
        _accumulate(self.weight, dy2.t().mm(x2))
        if self.bias is not None:
            _accumulate(self.bias, dy2.sum(0))


class NormDeferred:
    """A bridged nn.LayerNorm call: input, row statistics and, after I, dy (all metered)."""

    __slots__ = ("module", "input", "mean", "rstd", "grad")

    def __init__(self, module: nn.LayerNorm):
        self.module = module
        self.input = self.mean = self.rstd = self.grad = None

    def input_grad(self, dy: Tensor) -> Tensor:
        return self._kernel(dy, (True, False, False))[0]

    def backward_weight(self) -> None:
        mod = self.module
        _, dw, db = self._kernel(unpack(self.grad), (False, mod.weight is not None, mod.bias is not None))
        if dw is not None:
            _accumulate(mod.weight, dw)
        if db is not None:
            _accumulate(mod.bias, db)

    def _kernel(self, dy: Tensor, mask: tuple[bool, bool, bool]):
        mod = self.module
        return torch.ops.aten.native_layer_norm_backward(
            dy, unpack(self.input), mod.normalized_shape, unpack(self.mean), unpack(self.rstd),
            mod.weight, mod.bias, list(mask),
        )


class GraphDeferred:
    """A bridged call of any other module: its output edge, parameters and, after I, dy."""

    __slots__ = ("params", "edge", "output", "input", "grad")

    def __init__(self, params: tuple[nn.Parameter, ...]):
        self.params = params
        self.edge = None
        self.output: Tensor | None = None  # held only until I
        self.input: Tensor | None = None  # the detached input, held only until I
        self.grad = None


class _LinearBridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, x, weight, bias, deferred: LinearDeferred, meter: SavedTensorMeter):
        deferred.input = meter.keep(x)
        ctx.deferred = deferred
        ctx.meter = meter
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        deferred: LinearDeferred = ctx.deferred
        deferred.grad = ctx.meter.keep(dy)
        dx = torch.matmul(dy, deferred.weight) if ctx.needs_input_grad[1] else None
        return None, dx, None, None, None, None


class _NormBridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, x, weight, bias, deferred: NormDeferred, meter: SavedTensorMeter):
        mod = deferred.module
        out, mean, rstd = torch.native_layer_norm(x, mod.normalized_shape, weight, bias, mod.eps)
        deferred.input, deferred.mean, deferred.rstd = meter.keep(x), meter.keep(mean), meter.keep(rstd)
        ctx.deferred = deferred
        ctx.meter = meter
        return out

    @staticmethod
    def backward(ctx, dy):
        deferred: NormDeferred = ctx.deferred
        deferred.grad = ctx.meter.keep(dy)
        dx = deferred.input_grad(dy) if ctx.needs_input_grad[1] else None
        return None, dx, None, None, None, None


class _GraphBridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, x, call: Callable[[Tensor], Tensor], deferred: GraphDeferred, meter: SavedTensorMeter):
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
        ctx.meter = meter
        return y.detach()

    @staticmethod
    def backward(ctx, dy):
        deferred: GraphDeferred = ctx.deferred
        deferred.grad = ctx.meter.keep(dy)
        dx = None
        if deferred.input is not None:
            (dx,) = torch.autograd.grad(
                deferred.output, deferred.input, dy, retain_graph=True, allow_unused=True
            )
        deferred.output = None
        deferred.input = None
        return None, dx, None, None, None


@dataclass
class SplitRecord:
    """What one microbatch's split forward left for I and W."""

    closed: list[LinearDeferred | NormDeferred] = field(default_factory=list)
    graph: list[GraphDeferred] = field(default_factory=list)
    loose: dict[int, nn.Parameter] = field(default_factory=dict)  # params of unbridged calls


class WeightDeferral:
    """Bridges the parametric modules of one stage module; inactive unless recording."""

    def __init__(self, module: nn.Module, meter: SavedTensorMeter):
        self.meter = meter
        # A leaf that every bridge takes as input, so that I reaches every bridge even
        # when the module input needs no gradient (stage 0, token ids).
        device = next(module.parameters()).device
        self.anchor = torch.empty(0, device=device, requires_grad=True)
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
        # Only stock modules whose parameters all train take a closed-form path; subclasses
        # may change forward.
        closed = None
        if len(params) == len(list(mod.parameters())):
            closed = {nn.Linear: "linear", nn.LayerNorm: "norm"}.get(type(mod))

        def forward(*args, **kwargs):
            record = self._record
            if record is None:
                return original(*args, **kwargs)
            if kwargs or len(args) != 1 or not isinstance(args[0], Tensor):
                for p in params:
                    record.loose[id(p)] = p
                return original(*args, **kwargs)
            if closed == "linear":
                deferred = LinearDeferred(mod.weight, mod.bias)
                record.closed.append(deferred)
                return _LinearBridge.apply(self.anchor, args[0], mod.weight, mod.bias, deferred, self.meter)
            if closed == "norm":
                deferred = NormDeferred(mod)
                record.closed.append(deferred)
                return _NormBridge.apply(self.anchor, args[0], mod.weight, mod.bias, deferred, self.meter)
            deferred = GraphDeferred(params)
            self._record = None  # modules inside this one run plainly within the bridge
            try:
                out = _GraphBridge.apply(self.anchor, args[0], original, deferred, self.meter)
            finally:
                self._record = record
            record.graph.append(deferred)
            return out

        return forward


def backward_weight(record: SplitRecord) -> None:
    """W: accumulate the parameter gradients that I left, releasing what it kept for them."""
    with torch.no_grad():  # a kept input may carry graph history; the gradients must not
        for d in record.closed:
            if d.grad is not None:  # None: the output did not reach the loss
                d.backward_weight()
    record.closed.clear()
    pending = [d for d in record.graph if d.grad is not None]
    if pending:
        params = list({id(p): p for d in pending for p in d.params}.values())
        grads = torch.autograd.grad(
            [d.edge for d in pending], params, grad_outputs=[unpack(d.grad) for d in pending], allow_unused=True
        )
        for param, grad in zip(params, grads):
            if grad is not None:
                _accumulate(param, grad)
    record.graph.clear()


def _accumulate(param: nn.Parameter, grad: Tensor) -> None:
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


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
