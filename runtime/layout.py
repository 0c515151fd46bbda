"""The 3D layout: how the world's ranks split into pipeline (pp), data (dp) and tensor (tp) parallelism.

A run has pp x dp x tp ranks. They form torch's `DeviceMesh` of shape (pp, dp, tp) with the
dims named ``("pp", "dp", "tp")`` (`MESH_DIMS`), built by `init_device_mesh`, so global rank

    rank = (pp_index * dp + dp_index) * tp + tp_index

Why this order (Megatron-LM orders its groups the same way, "tp-dp-pp" from the innermost out):

- tp innermost: a tensor-parallel group is tp consecutive ranks, i.e. inside one node
  (torchrun numbers a node's ranks consecutively), because its collectives run inside every
  layer's forward and backward and need the node's fastest links.
- dp next: a data-parallel group is dp ranks tp apart, so for dp x tp up to a node's size it
  stays inside the node too; it moves a whole stage's gradients once per step.
- pp outermost: pipeline neighbours are dp x tp ranks apart, on different nodes first. The
  pipeline sends one activation per microbatch point to point, the lightest traffic of the three.

Every (dp, tp) coordinate runs the schedule's streams unchanged on its own pipeline: pipeline
rank r (the schedule's rank, 0 .. pp-1) is global rank `rank_of(r, dp_index, tp_index)`.
`Layout` is plain data: it is checked against the world size before any communication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .errors import ConfigError

MESH_DIMS = ("pp", "dp", "tp")


class Coords(NamedTuple):
    """A rank's place in the mesh: pipeline rank, data-parallel replica, tensor-parallel shard."""

    pp: int
    dp: int
    tp: int


@dataclass(frozen=True)
class Layout:
    """pp pipeline ranks x dp data-parallel replicas x tp tensor-parallel shards (see module doc)."""

    pp: int
    dp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for name in MESH_DIMS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--{name} must be a positive integer; got {value!r}")

    @staticmethod
    def for_world(world_size: int, pp: int | None = None, dp: int = 1, tp: int = 1) -> "Layout":
        """The layout of a world of `world_size` ranks; `pp` None means world / (dp x tp).

        Raises ConfigError (one line) when the sizes do not multiply to the world size; every
        rank calls this before any communication, so every rank refuses a bad layout itself.
        """
        for name, value in (("dp", dp), ("tp", tp)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"--{name} must be a positive integer; got {value!r}")
        if pp is None:
            if world_size % (dp * tp):
                raise ConfigError(
                    f"the world has {world_size} ranks, not a multiple of --dp {dp} x --tp {tp} = {dp * tp}"
                )
            pp = world_size // (dp * tp)
        layout = Layout(pp, dp, tp)
        if layout.size != world_size:
            raise ConfigError(
                f"--pp {pp} x --dp {dp} x --tp {tp} = {layout.size} ranks but the world has {world_size} "
                f"(launch pp x dp x tp processes, e.g. torchrun --nproc-per-node {layout.size})"
            )
        return layout

    @property
    def size(self) -> int:
        """Ranks in the layout: pp x dp x tp."""
        return self.pp * self.dp * self.tp

    @property
    def shape(self) -> tuple[int, int, int]:
        """The mesh shape, in `MESH_DIMS` order."""
        return (self.pp, self.dp, self.tp)

    def rank_of(self, pp: int, dp: int = 0, tp: int = 0) -> int:
        """The global rank at mesh coordinates (pp, dp, tp)."""
        return (pp * self.dp + dp) * self.tp + tp

    def coords(self, rank: int) -> Coords:
        """The mesh coordinates of global `rank`."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside a layout of {self.size} ranks")
        rest, tp = divmod(rank, self.tp)
        pp, dp = divmod(rest, self.dp)
        return Coords(pp, dp, tp)

    def pipeline(self, rank: int) -> tuple[int, ...]:
        """Global ranks of `rank`'s pipeline, indexed by pipeline rank (same dp and tp coordinates)."""
        here = self.coords(rank)
        return tuple(self.rank_of(p, here.dp, here.tp) for p in range(self.pp))

    def pipelines(self) -> tuple[tuple[int, ...], ...]:
        """Every pipeline's global ranks, in (dp, tp) order (the order every rank creates groups in)."""
        return tuple(self.pipeline(self.rank_of(0, d, t)) for d in range(self.dp) for t in range(self.tp))

    def neighbours(self, rank: int) -> tuple[int | None, int | None]:
        """Global ranks of the previous and next pipeline rank of `rank` (None at the pipeline's ends)."""
        here = self.coords(rank)
        before = self.rank_of(here.pp - 1, here.dp, here.tp) if here.pp > 0 else None
        after = self.rank_of(here.pp + 1, here.dp, here.tp) if here.pp < self.pp - 1 else None
        return before, after

    def dp_group(self, rank: int) -> tuple[int, ...]:
        """Global ranks of `rank`'s data-parallel group (same pp and tp coordinates), by dp index."""
        here = self.coords(rank)
        return tuple(self.rank_of(here.pp, d, here.tp) for d in range(self.dp))

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """Global ranks of `rank`'s tensor-parallel group (consecutive ranks), by tp index."""
        here = self.coords(rank)
        return tuple(self.rank_of(here.pp, here.dp, t) for t in range(self.tp))

    def describe(self) -> str:
        return f"pp={self.pp} x dp={self.dp} x tp={self.tp}"


def device_mesh(layout: Layout, device_type: str, timeout: float | None = None):
    """torch's DeviceMesh of `layout` (dims `MESH_DIMS`); collective over the default group.

    `mesh["dp"]`, `mesh["tp"]` and `mesh["pp"]` are then this rank's sub-meshes (their
    `get_group()` the process groups). Call it on every rank, in the same order as every
    other group creation. `timeout` (seconds) bounds every collective on the mesh's groups:
    without it they would wait torch's default (30 minutes on gloo) for a silent peer.
    """
    import datetime

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    override = None
    if timeout is not None:
        backend = dist.get_backend()
        options = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
        options._timeout = datetime.timedelta(seconds=timeout)
        override = {name: (backend, options) for name in MESH_DIMS}
    return init_device_mesh(device_type, layout.shape, mesh_dim_names=MESH_DIMS, backend_override=override)
