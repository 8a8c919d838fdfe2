"""Every way of making the row and column groups gives each rank the same groups (fake backend, 2,176 ranks)."""

from unittest import mock

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from torus_train.comm.groups import build_grid_groups, group_method  # noqa: E402
from torus_train.job.topology import Grid  # noqa: E402


def _groups(grid, rank, method):
    patches = []
    if method == "split":  # split_group needs an accelerator and a bound device; the fake backend uses neither
        patches = [
            mock.patch("torch.accelerator.is_available", return_value=True),
            mock.patch("torch.accelerator.current_accelerator", return_value=torch.device("cuda")),
        ]
    for p in patches:
        p.start()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=grid.size)
    try:
        if method == "split":
            dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
            assert group_method("auto") == "split"
        g = build_grid_groups(grid, use_shm=False, method=method)
        return (
            dist.get_process_group_ranks(g.row_group) if g.row_group else None,
            dist.get_process_group_ranks(g.col_group) if g.col_group else None,
            g.notes,
        )
    finally:
        dist.destroy_process_group()
        for p in patches:
            p.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["per-group", "enumerate", "split"])
@pytest.mark.parametrize("x, y", [(32, 68), (3, 2), (1, 4), (4, 1)])
def test_every_method_builds_the_grid_groups(method, x, y):
    grid = Grid(x, y, 4)
    for rank in sorted({0, grid.size // 2 + 1, grid.size - 1}):
        row, col = grid.position(rank)
        rows, cols, notes = _groups(grid, rank, method)
        assert rows == (grid.row_ranks(row) if x > 1 else None)
        assert cols == (grid.col_ranks(col) if y > 1 else None)
        assert notes == [f"row and column groups: {method}"]


def test_auto_without_a_bound_device_enumerates():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        assert group_method("auto") == "enumerate"
        with pytest.raises(ValueError, match="not one of auto, split, enumerate, per-group"):
            group_method("nccl-split")
    finally:
        dist.destroy_process_group()
