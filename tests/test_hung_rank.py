"""A hung rank under mpirun or srun, named from the ranks' own lines (ranks/diagnosis.accused): the markers are
the ones real ranks wrote in a run with rank 3 stopped (tests/dist/test_hung_rank_mpirun.py runs it whole);
the launcher's own lines name no rank here, as mpirun's do not for ranks that exit with code 1."""

from __future__ import annotations

import json
import os
import time

from torus_train.errors import RunFailed
from torus_train.job.launchers import LAUNCHERS
from torus_train.ranks.diagnosis import accused, command_failed

GLOO_TIMEOUT = (
    "a collective waited comm.timeout_s for a peer (a lost, hung or cut-off rank): [gloo/transport/tcp/"
    "unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete"
)
CLOSED = (
    "a peer's connection closed in a collective (the peer died?): [gloo/transport/tcp/pair.cc:561] Connection closed"
)


def marker(out, rank: int, message: str, age: float) -> None:
    path = out / "logs" / f"rank{rank:05d}.failed"
    path.write_text(json.dumps({"rank": rank, "code": 1, "kind": "crash", "message": message}))
    os.utime(path, (time.time() - age, time.time() - age))


def test_the_rank_its_row_waited_for_is_named_with_its_host(tmp_path):
    (tmp_path / "logs").mkdir()
    marker(tmp_path, 0, CLOSED, 5)
    marker(tmp_path, 1, GLOO_TIMEOUT, 6)
    marker(tmp_path, 2, "rank 2: reduce-scatter of row [2, 3] timed out after 20 s waiting for rank 3", 6)
    hosts = ["node1", "node1", "node2", "node2"]
    for name in ("mpirun", "srun"):
        e = command_failed(RunFailed(f"{name} exited with code 1"), tmp_path, 4, LAUNCHERS.get(name), hosts.__getitem__)
        assert e.rank == 3 and e.restartable
        assert str(e).startswith("rank 3 on node2 stopped responding: rank(s) 2 timed out") and name in str(e)


def test_the_ranks_word_on_a_hang_comes_before_sruns_word_on_its_own_kill(tmp_path):
    """srun names the task it killed at the end (the stopped one, as "Killed") or the first that exited 1."""
    from torus_train.ranks.runner import CommandFailed

    (tmp_path / "logs").mkdir()
    marker(tmp_path, 2, "rank 2: reduce-scatter of row [2, 3] timed out after 20 s waiting for rank 3", 6)
    srun = LAUNCHERS.get("srun")
    for lines in (["srun: error: node2: task 3: Killed"], ["srun: error: node1: tasks 0-1: Exited with exit code 1"]):
        e = command_failed(CommandFailed("srun exited with code 1", lines), tmp_path, 4, srun, lambda r: "node2")
        assert e.how == "rank 3 on node2 stopped responding", lines
    marker(tmp_path, 2, "rank 2: rank 3 (pid 77) exited during the reduce-scatter of row [2, 3]", 6)
    e = command_failed(
        CommandFailed("srun exited with code 1", ["srun: error: node2: task 3: Killed"]), tmp_path, 4, srun
    )
    assert e.how == "rank 3 on node2 was killed by SIGKILL"  # a crash: srun's own word stands


def test_the_stopped_rank_woken_at_the_end_does_not_move_the_blame(tmp_path):
    """Woken by the launcher's SIGCONT after its peers gave up, rank 3 finds rank 2 gone and says so, later
    than rank 2's timeout; or it times out itself, waiting for rank 2, after rank 2 waited for it."""
    (tmp_path / "logs").mkdir()
    marker(tmp_path, 2, "rank 2: all-gather of row [2, 3] timed out after 20 s waiting for rank 3", 9)
    marker(tmp_path, 3, "rank 3: rank 2 (pid 812) exited during the all-gather of row [2, 3]", 1)
    assert accused(tmp_path, 4) == (3, [2])  # rank 3 saw rank 2 exit, but rank 2 waited for rank 3 first
    assert command_failed(RunFailed("mpirun exited with code 1"), tmp_path, 4, LAUNCHERS.get("mpirun")).rank == 3
    marker(tmp_path, 3, "rank 3: all-gather of row [2, 3] timed out after 20 s waiting for rank 2", 1)
    assert accused(tmp_path, 4) == (3, [2])  # named first in time


def stalled(out, rank: int, message: str, age: float, seconds: float) -> None:
    marker(out, rank, message, age)
    path = out / "logs" / f"rank{rank:05d}.failed"
    d = json.loads(path.read_text())
    path.write_text(json.dumps({**d, "stalled_s": seconds}))
    os.utime(path, (time.time() - age, time.time() - age))


def test_the_hang_spreads_along_the_grid_and_the_stopped_rank_says_it_did_not_run(tmp_path):
    """As seen under srun on the namespace cluster: rank 3 stopped; rank 1 (its column) timed out in gloo,
    rank 0 (rank 1's row) then timed out waiting for rank 1, and rank 3, woken at the end, timed out last."""
    (tmp_path / "logs").mkdir()
    marker(tmp_path, 1, GLOO_TIMEOUT, 3.0)
    marker(tmp_path, 2, GLOO_TIMEOUT, 3.0)
    marker(tmp_path, 0, "rank 0: reduce-scatter of row [0, 1] timed out after 20 s waiting for rank 1", 2.9)
    assert accused(tmp_path, 4) == (3, [1, 2, 0])  # the one silent rank: every other one timed out
    stalled(tmp_path, 3, GLOO_TIMEOUT, 2.6, 41.0)
    e = command_failed(RunFailed("srun exited with code 1"), tmp_path, 4, LAUNCHERS.get("srun"), lambda r: "node2")
    assert str(e).startswith("rank 3 on node2 stopped responding (it did not run for 41 s): rank(s) 1, 2, 0 timed out")
    marker(tmp_path, 3, GLOO_TIMEOUT, 2.6)  # without its own word, rank 0's names rank 1, who waited first
    assert accused(tmp_path, 4) == (1, [0])


def test_no_named_peer_keeps_the_launchers_account(tmp_path):
    (tmp_path / "logs").mkdir()
    marker(tmp_path, 1, GLOO_TIMEOUT, 2)
    assert accused(tmp_path, 4) is None
    e = command_failed(RunFailed("mpirun exited with code 1"), tmp_path, 4, LAUNCHERS.get("mpirun"))
    assert str(e) == "mpirun exited with code 1" and "the 4-rank step failed" in e.how
