"""The DDP hook's gradients equal DDP's default all-reduce on a model whose gradients differ per rank."""
import sys
from pathlib import Path

import pytest

from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("hook_worker.py"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("grid", ["2x2", "3x2"])
def test_hook_matches_ddp_default(grid, tmp_path):
    x, y = map(int, grid.split("x"))
    world = x * y
    out = tmp_path / "checks"
    port = str(free_port())
    envs = [{"RANK": str(r), "WORLD_SIZE": str(world), "MASTER_PORT": port, "GRID": grid, "CHECK_OUT": str(out),
             "OMP_NUM_THREADS": "1"} for r in range(world)]
    run_local_ranks([[sys.executable, WORKER]] * world, envs, what=f"hook check on {grid}")
    assert [int(Path(f"{out}.{r}").read_text()) for r in range(world)] == [9] * world
