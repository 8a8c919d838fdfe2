"""The pipelined torus exchange (comm/pipeline.py): with bucket k+1's row phase beside bucket k's column phase,
BucketedModel's gradients are the plain all-reduce's mean on a model whose gradients differ per rank, bit for
bit the serial exchange's, on shared-memory and gloo rows; the NCCL lanes' order and layout run on gloo too
(tests/dist/pipeline_worker.py says how)."""

import sys
from pathlib import Path

import pytest

from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("pipeline_worker.py"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("grid", ["2x2", "2x3"])
def test_pipelined_gradients_equal_plain_allreduce(grid, tmp_path):
    x, y = map(int, grid.split("x"))
    world, port, out = x * y, str(free_port()), tmp_path / "checks"
    envs = [
        {
            "RANK": str(r),
            "WORLD_SIZE": str(world),
            "MASTER_PORT": port,
            "GRID": grid,
            "CHECK_OUT": str(out),
            "OMP_NUM_THREADS": "1",
            "TORUS_TRAIN_SHM_PIECE_MB": "0.001",  # 1 KiB pieces: buckets cross a shared-memory row in many
            "TORUS_TRAIN_PIPELINE": "auto",
        }
        for r in range(world)
    ]
    run_local_ranks([[sys.executable, WORKER]] * world, envs, what=f"pipelined exchange on {grid}")
    assert [int(Path(f"{out}.{r}").read_text()) for r in range(world)] == [8] * world  # 2 rows x (2 + 1) + 2
