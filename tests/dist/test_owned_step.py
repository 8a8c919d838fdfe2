"""The step the loop runs (train/step.py step_body over comm/buckets.py's owned buckets), run eagerly, ends with
the same parameters, bit for bit, as the same steps under DDP with the torus hook (or DDP's own all-reduce)."""

import sys
from pathlib import Path

import pytest

from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("step_worker.py"))


def run(grid: str, algos: str, out: Path) -> list[int]:
    x, y = map(int, grid.split("x"))
    world, port = x * y, str(free_port())
    envs = [
        {
            "RANK": str(r),
            "WORLD_SIZE": str(world),
            "MASTER_PORT": port,
            "GRID": grid,
            "ALGOS": algos,
            "CHECK_OUT": str(out),
            "OMP_NUM_THREADS": "1",
        }
        for r in range(world)
    ]
    run_local_ranks([[sys.executable, WORKER]] * world, envs, what=f"owned step check on {grid}")
    return [int(Path(f"{out}.{r}").read_text()) for r in range(world)]


@pytest.mark.timeout(180)
def test_owned_buckets_step_equals_ddp_on_a_2x2_torus(tmp_path):
    # 2x2: every element is (a + b) + (c + d) whichever rank sums it, so bucket boundaries cannot change a bit
    assert run("2x2", "torus,torus-sync", tmp_path / "c") == [4] * 4  # 2 algos x accumulation 1 and 2


@pytest.mark.timeout(180)
def test_owned_buckets_step_equals_ddp_flat_on_two_ranks(tmp_path):
    assert run("2x1", "ddp,hierarchical", tmp_path / "c") == [4] * 2
