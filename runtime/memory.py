"""Activation memory: bytes of the tensors autograd saves for backward, per rank.

Autograd's saved-tensor hooks see every tensor as it is saved; the packed handle is
released when autograd frees the saved variable, so the count goes up during forward
and down as backward (or W) consumes the graph. Storages are counted once however many
ops save them (views of one activation share a storage). Parameters and the batch
itself (inputs, targets) are not activations: they live for the whole run, so their
storages are skipped. Under tensor parallelism autograd saves DTensors, which have no
storage of their own: their local shard's storage is counted (and skipped) instead.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor


class _Held:
    """A saved tensor as autograd holds it; its death releases the bytes it counted."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor: Tensor, meter: "SavedTensorMeter", key: int):
        self.tensor = tensor
        self.meter = meter
        self.key = key

    def __del__(self) -> None:
        self.meter._release(self.key)


class SavedTensorMeter:
    """Counts the bytes of saved-for-backward storages held right now, and their peak."""

    def __init__(self, exclude: Iterable[Tensor]):
        self._skip = {_local(t).untyped_storage().data_ptr() for t in exclude}
        self._held: dict[int, list[int]] = {}  # storage address -> [handles alive, bytes]
        self.bytes = 0
        self.peak = 0

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """Context manager under which saved tensors are counted."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, unpack)

    def keep(self, tensor: Tensor):
        """Hold `tensor` for a later backward step (W) outside autograd, counted like a saved
        tensor until the returned handle is dropped; `unpack` gives the tensor back."""
        return self._pack(tensor)

    def held_bytes(self, tensor: Tensor | None) -> int:
        """Bytes of `tensor`'s storage counted right now (0 if nothing saved holds it)."""
        if tensor is None:
            return 0
        entry = self._held.get(_storage_key(_local(tensor)))
        return 0 if entry is None else entry[1]

    def reset_peak(self) -> None:
        self.peak = self.bytes

    def _pack(self, tensor: Tensor):
        local = _local(tensor)
        key = _storage_key(local)
        if key == 0 or key in self._skip:
            return tensor
        entry = self._held.get(key)
        if entry is None:
            size = local.untyped_storage().nbytes()
            self._held[key] = [1, size]
            self.bytes += size
            if self.bytes > self.peak:
                self.peak = self.bytes
        else:
            entry[0] += 1
        return _Held(tensor, self, key)

    def _release(self, key: int) -> None:
        entry = self._held[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self._held[key]
            self.bytes -= entry[1]


def _storage_key(local: Tensor) -> int:
    """The storage's address, without building a storage object (this runs per saved
    tensor); 0 for sparse and other storage-less tensors."""
    try:
        return local.data_ptr() - local.storage_offset() * local.element_size()
    except (RuntimeError, NotImplementedError):
        return 0


def _local(tensor: Tensor) -> Tensor:
    """The tensor whose storage holds `tensor`'s bytes on this rank: a DTensor's local shard."""
    if isinstance(tensor, DTensor):
        with torch.no_grad():
            return tensor.to_local()
    return tensor


def unpack(packed):
    return packed.tensor if type(packed) is _Held else packed
