"""Tensor parallelism inside a pipeline stage: the gpt blocks split t ways with torch's DTensor.

Each transformer block (`models.Block`) is cut as in Megatron-LM (Shoeybi et al. 2019,
section 3), with `torch.distributed.tensor.parallel.parallelize_module` on a 1-D "tp"
device mesh:

- attention: `attn.qkv` column-parallel (each rank holds the q, k, v rows of heads / t
  whole heads: models.CausalSelfAttention lays the fused rows out head by head) and
  `attn.proj` row-parallel; each rank attends over its heads / t heads only.
- MLP: `mlp.0` (hidden -> 4 hidden) column-parallel, `mlp.2` (4 hidden -> hidden)
  row-parallel; the GELU between them runs on the local shard.

So a block's forward costs two all-reduces (after each row-parallel linear) and its
backward two more (the input gradients of the column-parallel linears). LayerNorms, the
embedding (prologue) and the LM head (epilogue) stay replicated: every tp rank holds and
computes them whole, on identical inputs, so their gradients are identical across tp
without communication. Sequence parallelism is not used.

The pipeline boundary stays plain tensors. A block takes and returns the full activation,
a local `torch.Tensor` replicated across tp: the column-parallel styles take their input
as `Replicate()` (the default input layout, `DTensor.from_local` with no communication;
in backward it all-reduces the input gradient, which comes out partial), and the
row-parallel styles return `Replicate()` with `use_local_output=True` (the default),
i.e. the all-reduced output as a local tensor. So the executor's point-to-point code
sends, receives and checks boundary shapes exactly as at t = 1, and every tp rank of a
stage sends the same activation to its own pipeline neighbour in the same tp position.

Parameters are sharded from each rank's own copy (`src_data_rank=None`): the model is
built from one seed on every rank, so nothing is broadcast. For --check,
`full_gradients` gathers every sharded gradient (`DTensor.full_tensor()`, a collective
on the tp group) so that it can be compared with the one-process reference as a whole.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from .comm import reason
from .errors import ConfigError, PeerError
from .models import Block, PipelineModel

# Submodule of a `Block` -> how it is split (module names as in models.Block).
BLOCK_PLAN = {
    "attn.qkv": ColwiseParallel(),
    "attn.proj": RowwiseParallel(),
    "mlp.0": ColwiseParallel(),
    "mlp.2": RowwiseParallel(),
}


def check_tensor_parallel(model: PipelineModel, tp: int) -> None:
    """Raise ConfigError (one line) unless `model` can be split `tp` ways; no communication.

    Only the built-in gpt model splits: every pipelined layer must be a `models.Block`
    whose heads `tp` divides.
    """
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ConfigError(f"--tp must be a positive integer; got {tp!r}")
    if tp == 1:
        return
    if model.name == "mlp":
        raise ConfigError(f"--tp {tp}: the mlp model runs with --tp 1 only (tensor parallelism splits gpt's attention and MLP)")
    if not all(isinstance(layer, Block) for layer in model.layers):
        raise ConfigError(f"--tp {tp}: tensor parallelism splits the gpt model's transformer blocks; model {model.name!r} has other layers")
    heads = model.layers[0].attn.heads
    if heads % tp:
        raise ConfigError(f"--tp {tp} does not divide --heads {heads}: each tensor-parallel rank needs whole attention heads")


def apply_tensor_parallel(stage: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """A copy of `stage` with every `models.Block` in it split across the 1-D mesh `tp_mesh`.

    `stage` (e.g. `PipelineModel.stage_module(...)`) is left untouched: its blocks share
    parameters with the `PipelineModel` (and its --check reference). Modules that are not
    blocks (embedding, LM head) are copied as they are, replicated. Call on every rank of
    the mesh, after `check_tensor_parallel`; parameter names are unchanged, so
    `full_gradients` matches the reference's names. Sharding itself communicates nothing.
    """
    if tp_mesh.ndim != 1:
        raise ValueError(f"apply_tensor_parallel needs a 1-D tp mesh; got {tp_mesh.ndim} dimensions")
    module = copy.deepcopy(stage)
    t = tp_mesh.size()
    for block in module.modules():
        if isinstance(block, Block):
            if block.attn.heads % t:
                raise ConfigError(f"--tp {t} does not divide --heads {block.attn.heads}")
            parallelize_module(block, tp_mesh, BLOCK_PLAN, src_data_rank=None)
    return module


def full_gradients(module: nn.Module) -> dict[str, Tensor | None]:
    """Every trainable parameter's gradient as a whole tensor, named as in `module`.

    Sharded (DTensor) gradients are gathered across their mesh with `full_tensor()`, a
    collective: every rank of the tp group must call this at the same point, in the same
    module order. Replicated gradients are returned as they are.
    """
    grads: dict[str, Tensor | None] = {}
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        grad = param.grad
        if isinstance(param, DTensor):
            # A missing gradient is gathered as zeros, so every tp rank makes the same collectives.
            grad = (grad if grad is not None else torch.zeros_like(param)).full_tensor()
        grads[name] = grad
    return grads


def local_numel(module: nn.Module, bytes: bool = False) -> int:
    """Trainable parameter elements (or their bytes) this rank holds: a DTensor counts its local shard."""
    total = 0
    for p in module.parameters():
        if p.requires_grad:
            local = p.to_local() if isinstance(p, DTensor) else p
            total += local.numel() * (local.element_size() if bytes else 1)
    return total


def collective_failure(
    exc: RuntimeError, rank: int, action: str, tp_ranks: tuple[int, ...], timeout: float
) -> PeerError | None:
    """The one-line PeerError for a compute action whose tp collective failed, or None when
    `exc` is not a communication failure (or there is no tp group: then it is the model's).

    gloo raises a plain RuntimeError naming its transport (a peer's closed connection, or
    the group's timeout, which the layout's mesh sets to --timeout); NCCL a DistError.
    """
    text = str(exc)
    if len(tp_ranks) < 2 or not (
        isinstance(exc, torch.distributed.DistError) or "gloo" in text.lower() or "nccl" in text.lower()
    ):
        return None
    return PeerError(
        f"rank {rank}: {action} failed in a collective of its tensor-parallel group (ranks "
        f"{', '.join(map(str, tp_ranks))}): {reason(exc, -1, timeout)}"
    )
