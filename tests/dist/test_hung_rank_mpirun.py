"""A rank stopped (SIGSTOP) under mpirun on this machine, comm.timeout_s 20: the final line names rank 3 and its
host from the ranks' own lines, the job ends in time and leaves no rank running. Real mpirun, real ranks."""

from __future__ import annotations

import re
import time

import pytest

from .runhelp import TINY, leftover_workers, mpi_available, run_cli

pytestmark = [pytest.mark.timeout(300), pytest.mark.mpi]


@pytest.mark.slow
def test_a_stopped_rank_under_mpirun_is_named_with_its_host(tmp_path):
    if not mpi_available():
        pytest.skip("no mpirun or mpi4py here")
    out, hosts = tmp_path / "run", tmp_path / "hosts"
    hosts.write_text("localhost slots=4\n")
    args = [*TINY, "--steps", "10", "--set", "comm.timeout_s=20", "--launcher", "mpirun", "--hostfile", str(hosts)]
    t0 = time.time()
    r = run_cli(*args, "--out", str(out), env={"TORUS_TRAIN_FAULT": "stop:3:3", "OMP_NUM_THREADS": "1"}, timeout=240)
    final = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1, r.stderr[-3000:]
    assert re.match(r"torus-train: error: rank 3 on localhost stopped responding: rank\(s\) [\d, ]*2", final), final
    assert time.time() - t0 < 200 and leftover_workers(out) == []
