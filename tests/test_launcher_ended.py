"""The launcher command (mpirun/srun) that does not exit after every rank has ended, as OpenMPI's mpirun
waits for the daemon of a node it cannot reach: torus-train stops it and fails with one line. The real
partition is tests/cluster/test_cluster_faults.py; here a `sleep` stands in for the hung mpirun."""

from __future__ import annotations

import os
import time

import pytest

from torus_train.errors import RunFailed
from torus_train.ranks import runner


def mark(out, rank, kind):
    path = out / "logs" / f"rank{rank:05d}.{kind}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    return path


def test_all_ended_for_needs_every_rank(tmp_path):
    assert runner.all_ended_for(tmp_path, 3) == 0.0
    mark(tmp_path, 0, "done")
    mark(tmp_path, 2, "failed")
    assert runner.all_ended_for(tmp_path, 3) == 0.0  # rank 1 still runs
    old = mark(tmp_path, 1, "failed")
    os.utime(old, (time.time() - 100, time.time() - 100))
    late = runner.all_ended_for(tmp_path, 3)
    assert 0.0 <= late < 5.0  # the newest marker counts, not the oldest
    for r in range(3):
        for kind in ("done", "failed"):
            p = tmp_path / "logs" / f"rank{r:05d}.{kind}"
            if p.exists():
                os.utime(p, (time.time() - 50, time.time() - 50))
    assert 49 < runner.all_ended_for(tmp_path, 3) < 60


@pytest.mark.timeout(30)
def test_a_launcher_that_outlives_its_ranks_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "ENDED_GRACE_S", 1.0)
    for r in range(2):
        mark(tmp_path, r, "failed")
    t = time.time()
    with pytest.raises(RunFailed, match=r"all 2 ranks ended .* but mpirun did not exit"):
        runner.run_command(["sleep", "1000"], {}, "mpirun", tmp_path, 2)
    assert time.time() - t < 15


@pytest.mark.timeout(30)
def test_a_launcher_with_live_ranks_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "ENDED_GRACE_S", 0.5)
    mark(tmp_path, 0, "done")  # rank 1 has not ended
    runner.run_command(["sleep", "2"], {}, "mpirun", tmp_path, 2)
