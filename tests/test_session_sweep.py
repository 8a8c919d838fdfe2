"""The suite's sweep of OpenMPI session directories (tests/conftest.py): only those of dead processes go."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import sweep_stale_mpi_session_dirs


def test_only_directories_of_dead_processes_are_removed(tmp_path):
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    dead = int(gone.stdout)
    for name in (f"prted.{dead}", f"ompi.{dead}", f"prted.{os.getpid()}", f"ompi.{os.getpid()}", "prted.x1"):
        (tmp_path / name / "0").mkdir(parents=True)
        (tmp_path / name / "pmix.node2.tool").write_text("left by a killed daemon\n")
    (tmp_path / f"notes.{dead}").mkdir()
    removed = sweep_stale_mpi_session_dirs(tmp_path)
    assert sorted(removed) == sorted([f"prted.{dead}", f"ompi.{dead}"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"prted.{os.getpid()}", f"ompi.{os.getpid()}", "prted.x1", f"notes.{dead}"]
    )
