"""runtime.layout: the (pp, dp, tp) mesh order against torch's DeviceMesh and hand-counted ranks."""

import pytest

from runtime.errors import ConfigError
from runtime.layout import MESH_DIMS, Layout


def test_ranks_are_row_major_over_pp_dp_tp():
    layout = Layout(pp=2, dp=3, tp=2)
    # Hand-written: tp consecutive, then dp, then pp (Megatron's tp-dp-pp order).
    assert [layout.coords(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert layout.coords(6) == (1, 0, 0) and layout.coords(11) == (1, 2, 1)
    assert all(layout.rank_of(*layout.coords(r)) == r for r in range(layout.size))
    assert layout.tp_group(5) == (4, 5)
    assert layout.dp_group(5) == (1, 3, 5)
    assert layout.pipeline(5) == (5, 11)
    assert layout.neighbours(5) == (None, 11) and layout.neighbours(11) == (5, None)
    assert sorted(r for p in layout.pipelines() for r in p) == list(range(12))


def test_order_matches_torchs_device_mesh():
    """init_device_mesh itself (on torch's fake backend: no peers needed) puts every rank
    where Layout says, and its named sub-meshes are Layout's groups."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from runtime.layout import device_mesh

    layout = Layout(pp=2, dp=2, tp=2)
    for rank in range(layout.size):
        dist.init_process_group("fake", rank=rank, world_size=layout.size, store=FakeStore())
        try:
            mesh = device_mesh(layout, "cpu")
            assert mesh.mesh_dim_names == MESH_DIMS
            assert tuple(mesh.get_coordinate()) == layout.coords(rank)
            assert tuple(mesh["dp"].mesh.tolist()) == layout.dp_group(rank)
            assert tuple(mesh["tp"].mesh.tolist()) == layout.tp_group(rank)
            assert tuple(mesh["pp"].mesh.tolist()) == layout.pipeline(rank)
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize(
    "world, pp, dp, tp, message",
    [
        (4, None, 3, 1, "not a multiple of --dp 3"),
        (8, 2, 2, 1, "= 4 ranks but the world has 8"),
        (4, None, 0, 1, "--dp must be a positive integer"),
        (4, 0, 2, 2, "--pp must be a positive integer"),
    ],
)
def test_bad_layouts_are_one_clear_line(world, pp, dp, tp, message):
    with pytest.raises(ConfigError, match=message) as info:
        Layout.for_world(world, pp, dp, tp)
    assert "\n" not in str(info.value)


def test_pp_defaults_to_world_over_dp_tp():
    assert Layout.for_world(8, None, 2, 2) == Layout(2, 2, 2)
    assert Layout.for_world(3) == Layout(3, 1, 1)
