"""The bucket exchange (comm/hooks.py through comm/buckets.py): its gradients equal DDP's default all-reduce on a
model whose gradients differ per rank (asynchronous and synchronous), and the NCCL path's chunk layout averages
exactly."""

import sys
from pathlib import Path

import pytest

from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("hook_worker.py"))


def run_check(check: str, grid: str, out: Path) -> list[int]:
    x, y = map(int, grid.split("x"))
    world = x * y
    port = str(free_port())
    envs = [
        {
            "RANK": str(r),
            "WORLD_SIZE": str(world),
            "MASTER_PORT": port,
            "GRID": grid,
            "CHECK_OUT": str(out),
            "CHECK": check,
            "OMP_NUM_THREADS": "1",
        }
        for r in range(world)
    ]
    run_local_ranks([[sys.executable, WORKER]] * world, envs, what=f"hook {check} check on {grid}")
    return [int(Path(f"{out}.{r}").read_text()) for r in range(world)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("grid", [pytest.param("2x2", marks=pytest.mark.slow), "3x2"])  # 3x2 (ragged) covers 2x2
def test_buckets_match_ddp_default(grid, tmp_path):
    world = int(grid[0]) * int(grid[2])
    assert run_check("grads", grid, tmp_path / "checks") == [18] * world  # 3 algos x 3 precisions x async/sync


@pytest.mark.timeout(120)
@pytest.mark.parametrize("grid", [pytest.param("2x2", marks=pytest.mark.slow), "3x2"])  # 3x2 (ragged) covers 2x2
def test_nccl_chunk_layout_averages_exactly(grid, tmp_path):
    """exchange_cuda (the hook's NCCL path) on CPU tensors over gloo: padding, compression, the three phases."""
    world = int(grid[0]) * int(grid[2])
    assert run_check("layout", grid, tmp_path / "checks") == [15] * world  # 5 lengths x 3 wire precisions
