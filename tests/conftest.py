"""Marks: every test under tests/dist starts several processes (ranks, mpirun) and is marked `dist`, so that
`python -m pytest -m "not dist"` runs the single-process tests alone. Tests marked `slow` (each over ~20 s
of multi-process training: the restart demo, resume against a straight run, ...) are skipped unless
TORUS_TRAIN_SLOW_TESTS=1, which keeps the default suite near 15 minutes on 2 cores.

Before each test, OpenMPI session directories left by killed launchers are removed (see
`sweep_stale_mpi_session_dirs`)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

DIST = Path(__file__).parent / "dist"


def pytest_collection_modifyitems(items):
    slow = pytest.mark.skip(reason="slow: set TORUS_TRAIN_SLOW_TESTS=1 to run it")
    run_slow = os.environ.get("TORUS_TRAIN_SLOW_TESTS") == "1"
    for item in items:
        if DIST in Path(item.fspath).parents:
            item.add_marker(pytest.mark.dist)
        if not run_slow and item.get_closest_marker("slow"):
            item.add_marker(slow)


# prterun (mpirun) and prted keep their session in TMPDIR/ompi.PID and TMPDIR/prted.PID and remove it on exit.
# Tests kill them (fault tests, watchdogs), which leaves the directory behind; this OpenMPI 5.0's PMIx then
# fails to start a later daemon that is given the same pid ("The PMIx server's listener thread failed to
# start", exit 213). With pid_max 32768 a 15-minute suite reuses pids, so one killed daemon can fail a test
# many minutes later. A rebooted node would have an empty /tmp; this does the same for dead pids only.
SESSION_DIR = re.compile(r"(ompi|prted|prterun)\.(\d+)")


def sweep_stale_mpi_session_dirs(tmp: Path | None = None) -> list[str]:
    """Remove OpenMPI session directories whose process no longer exists; return their names."""
    removed = []
    for entry in os.scandir(tmp or tempfile.gettempdir()):
        m = SESSION_DIR.fullmatch(entry.name)
        if m and entry.is_dir(follow_symlinks=False) and not _alive(int(m.group(2))) and _mine(entry):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


def _alive(pid: int) -> bool:
    """True for a running or zombie pid, and for another user's (its owner may still use the directory)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _mine(entry: os.DirEntry) -> bool:
    try:  # a daemon still exiting may remove its directory between the listing and here
        return entry.stat(follow_symlinks=False).st_uid == os.geteuid()
    except OSError:
        return False


@pytest.fixture(autouse=True)
def _no_stale_mpi_session_dirs():
    sweep_stale_mpi_session_dirs()
