"""The launcher's fault logic without processes: heartbeats, who stopped first, what is restarted."""

from __future__ import annotations

import re
import time

import pytest

from torus_train.errors import PeerLost, RunFailed, UserError
from torus_train.job.spec import load_spec
from torus_train.ranks.diagnosis import RanksFailed, restartable
from torus_train.ranks.heartbeat import Beat, Heartbeat, first_stopped, read_beats
from torus_train.ranks.orchestrate import no_restart
from torus_train.ranks.watchdog import Watch, watchdog_limits
from torus_train.ranks.worker import Terminated, classify
from torus_train.train.stop import StopRequested


def test_heartbeat_writes_the_last_step_within_a_second(tmp_path):
    (tmp_path / "logs").mkdir()
    hb = Heartbeat(tmp_path, 3, every_s=0.2)
    assert read_beats(tmp_path, 4)[3].step == -1  # written at start
    for step in range(1, 6):
        hb.record(step)
    deadline = time.time() + 5
    while read_beats(tmp_path, 4)[3].step != 5:  # the last record reaches the file even without another step
        assert time.time() < deadline
        time.sleep(0.05)
    b = read_beats(tmp_path, 4)[3]
    assert (b.rank, b.step) == (3, 5) and abs(b.time - time.time()) < 5
    assert set(read_beats(tmp_path, 4)) == {3}  # ranks without a file are absent


def test_a_step_never_waits_on_the_beat_file(tmp_path, monkeypatch):
    """A file system that hangs in the rename (a slow metadata server) stalls the writer thread, not record."""
    import threading

    from torus_train.ranks import heartbeat

    (tmp_path / "logs").mkdir()
    hb = Heartbeat(tmp_path, 0, every_s=0.05)
    stuck, entered = threading.Event(), threading.Event()
    rename = heartbeat.os.replace

    def slow_replace(a, b):
        entered.set()
        stuck.wait(10)
        rename(a, b)

    monkeypatch.setattr(heartbeat.os, "replace", slow_replace)
    hb.record(1)
    assert entered.wait(5)  # the writer thread is inside the rename, and stays there
    t = time.perf_counter()
    for step in range(2, 10002):
        hb.record(step)
    assert time.perf_counter() - t < 2  # the file system is stuck for 10 s: waiting on it would show
    stuck.set()
    hb.close()
    assert read_beats(tmp_path, 1)[0].step == 10001


def test_beats_are_rarer_above_256_ranks():
    from torus_train.ranks.heartbeat import beat_interval

    assert beat_interval(4) == beat_interval(256) == 1.0 and beat_interval(2176) == 8.5


def test_first_stopped_is_the_lowest_step():
    beats = {r: Beat(r, 100 + r, s, 0.0) for r, s in enumerate([7, 6, 7, 6])}
    assert first_stopped(beats) == [1, 3]
    assert first_stopped({}) == []


@pytest.mark.parametrize(
    "code, kind, ok",
    [
        (-9, "", True),
        (0, "", True),
        (1, "", True),
        (1, "crash", True),
        (1, "verdict", False),
        (2, "input", False),
        (143, "stopped", False),
    ],
)
def test_what_a_restart_may_cure(code, kind, ok):
    assert restartable(code, kind) is ok


def test_classify_a_ranks_failure():
    assert classify(UserError("x"))[:2] == (2, "input")
    assert classify(StopRequested("x"))[:2] == (143, "stopped")
    assert classify(Terminated("x"))[:2] == (143, "stopped")
    assert classify(RunFailed("replicas differ"))[:2] == (1, "verdict")
    assert classify(RuntimeError("Connection closed by peer\nmore"))[:3] == (
        1,
        "crash",
        "a peer's connection closed in a collective (the peer died?): Connection closed by peer",
    )
    assert classify(RuntimeError("[x.cc:78] Timed out waiting 20000ms for recv"))[2].startswith(
        "a collective waited comm.timeout_s for a peer"
    )
    assert classify(KeyError("k"))[:3] == (1, "crash", "KeyError: 'k'")
    # a peer lost in the shared-memory row: a crash (restartable), not a verdict on the job
    assert classify(PeerLost("rank 0: rank 1 (pid 7) exited during the all-gather of row [0, 1]")) == (
        1,
        "crash",
        "rank 0: rank 1 (pid 7) exited during the all-gather of row [0, 1]",
    )


def test_no_restart_reasons():
    e = lambda **kw: RanksFailed("x", **{"rank": 1, "step": 5, "restartable": True, "progressed": True, **kw})  # noqa: E731
    assert no_restart(e(), 0, 2) == ""
    assert "interrupted" in no_restart(e(rank=-1), 0, 2)
    assert "would repeat" in no_restart(e(restartable=False), 0, 2)
    assert "start-up failure" in no_restart(e(progressed=False), 0, 2)
    assert no_restart(e(), 2, 2) == "gave up after 2 restart(s)"


def test_watchdog_limits_and_the_start_up_allowance():
    spec = load_spec(None, [("comm.timeout_s", 30.0)])
    assert watchdog_limits(spec) == (90.0, 90.0)
    spec = load_spec(None, [("comm.timeout_s", 30.0), ("launch.watchdog_s", 5.0)])
    assert watchdog_limits(spec) == (5.0, 90.0)
    staged = load_spec(None, [("comm.timeout_s", 30.0), ("data.stage", "node"), ("data.stage_timeout_s", 900.0)])
    assert watchdog_limits(staged) == (90.0, 990.0)  # a node's copy may take its own limit before the first step
    w = Watch(5.0, 90.0, {}, changed=0.0)
    assert not w.due(10.0, 2)  # before every rank finished a step: the start-up limit
    w.seen = {0: Beat(0, 1, 1, 0.0), 1: Beat(1, 2, 0, 0.0)}
    assert w.due(10.0, 2)
    with pytest.raises(UserError, match=re.escape("launch.watchdog_s")):
        load_spec(None, [("launch.watchdog_s", -1.0)])


def test_a_failed_mpirun_step_is_judged_from_the_ranks_files(tmp_path):
    import json

    from torus_train.job.launchers import LAUNCHERS
    from torus_train.ranks.diagnosis import command_failed

    mpirun = LAUNCHERS.get("mpirun")
    logs = tmp_path / "logs"
    logs.mkdir()
    e = command_failed(RunFailed("mpirun exited with code 137; see ..."), tmp_path, 2, mpirun)
    assert (e.restartable, e.progressed, e.step) == (True, False, -1)  # nothing written: a start-up failure
    (logs / "rank00000.beat").write_text(json.dumps({"rank": 0, "pid": 1, "step": 4, "time": 0.0}))
    (logs / "rank00000.failed").write_text(json.dumps({"kind": "stopped"}))  # mpirun's SIGTERM after rank 1 died
    e = command_failed(RunFailed("mpirun exited with code 137"), tmp_path, 2, mpirun)
    assert (e.restartable, e.progressed) == (True, True) and "the 2-rank step failed (mpirun exited" in e.how
    (logs / "rank00001.failed").write_text(json.dumps({"kind": "verdict"}))
    assert command_failed(RunFailed("mpirun exited with code 1"), tmp_path, 2, mpirun).restartable is False
    assert command_failed(RunFailed("interrupted by SIGTERM: forwarded to mpirun"), tmp_path, 2, mpirun).rank == -1


def test_the_rank_mpirun_or_srun_names():
    from torus_train.job.launchers import LAUNCHERS
    from torus_train.ranks.diagnosis import command_failed
    from torus_train.ranks.runner import CommandFailed

    mpirun, srun = LAUNCHERS.get("mpirun"), LAUNCHERS.get("srun")

    mpi = [
        "----",
        "prterun noticed that process rank 3 with PID 28781 on node node2 exited on",
        "signal 9 (Killed).",
        "----",
    ]
    assert mpirun.culprit(mpi) == (3, "node2", "was killed by SIGKILL")
    assert srun.culprit(["srun: error: node2: tasks 2-3: Killed"]) == (2, "node2", "was killed by SIGKILL")
    srun_lines = [
        "srun: error: node2: task 2: Exited with exit code 1",
        "srun: launch/slurm: _step_signal: Terminating",
        "srun: error: node2: task 3: Killed",
        "srun: error: node1: tasks 0-1: Exited with exit code 1",
    ]
    assert srun.culprit(srun_lines) == (3, "node2", "was killed by SIGKILL")  # the killed task, not the first line
    assert srun.culprit(["srun: error: node1: task 0: Exited with exit code 1"]) == (
        0,
        "node1",
        "ended (Exited with exit code 1)",
    )
    assert mpirun.culprit(["nothing useful"]) is None and srun.culprit(["nothing useful"]) is None
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (pathlib.Path(d) / "logs").mkdir()
        e = command_failed(CommandFailed("mpirun exited with code 137", mpi), pathlib.Path(d), 4, mpirun)
    assert (e.rank, e.how) == (3, "rank 3 on node2 was killed by SIGKILL")


NCCL_LINES = {
    "watchdog": "[rank1]:[E1204 05:40:01.123 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=6422528, NumelOut=6422528, Timeout(ms)=600000) "
    "ran for 600021 milliseconds before timing out.",
    "abort": "[rank1]:[E1204 05:40:01.200 ProcessGroupNCCL.cpp:1720] [PG 0 Rank 1] Some NCCL operations have failed "
    "or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
    "corrupted/incomplete data.",
    "system": "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2030, unhandled system error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3",
    "remote": "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
}


@pytest.mark.parametrize(
    "kind, meaning",
    [
        ("watchdog", "an NCCL collective ran past comm.timeout_s and NCCL's watchdog aborted it"),
        ("abort", "NCCL took the rank down after a failed or timed-out collective"),
        ("system", "NCCL system error"),
        ("remote", "NCCL remote error: a peer exited or the network between them failed"),
    ],
)
def test_nccl_failures_are_named_like_gloos(tmp_path, kind, meaning):
    from torus_train.ranks.diagnosis import failure_kind, mark_comm_failure

    code, what, line = classify(RuntimeError(NCCL_LINES[kind] + "\nException raised from ..."))
    assert (code, what) == (1, "crash") and line.startswith(meaning) and NCCL_LINES[kind][:60] in line
    # the watchdog took the process down before Python ran: the launcher finds the words in the rank's log
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank00001.log").write_text(f"step 811 ...\n{NCCL_LINES[kind]}\nAborted (core dumped)\n")
    said = mark_comm_failure(tmp_path, 1)
    assert said.startswith(meaning) and failure_kind(tmp_path, 1) == "crash"
    assert mark_comm_failure(tmp_path, 1) == ""  # a marker is there now: the rank's own word stands
    (tmp_path / "logs" / "rank00002.log").write_text("Segmentation fault\n")
    assert mark_comm_failure(tmp_path, 2) == "" and failure_kind(tmp_path, 2) == ""


def test_torch_record_writes_the_traceback_the_launcher_shows(tmp_path, monkeypatch):
    """The first failing rank's traceback comes from torch's `record` (TORCHELASTIC_ERROR_FILE, in torch's own
    format), else from its log's tail; the flight recorder's dumps are named with the command that reads them."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from torus_train.ranks.diagnosis import Failure, error_path, ranks_failed, reset_rank_files, trace_path

    (tmp_path / "logs").mkdir()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_path(tmp_path, 1)))

    def fails_deep_inside():
        raise RuntimeError("a crash three frames down")

    with pytest.raises(RuntimeError):
        record(fails_deep_inside)()
    (tmp_path / "logs" / "rank00001.log").write_text("last log line\n")
    trace_path(tmp_path, 0).write_bytes(b"a pickle")
    said: list[str] = []
    e = ranks_failed(
        Failure(1, "rank 1 exited with code 1", "rank 1 exited with code 1", True), tmp_path, 2, said.append
    )
    assert said[0] == f"traceback in {error_path(tmp_path, 1)}:" and "in fails_deep_inside" in "\n".join(said)
    assert said[-2] == "  RuntimeError: a crash three frames down" and "last log line" not in "\n".join(said)
    assert (
        said[-1]
        == f"NCCL's flight recorder dumped the last collectives of rank(s) 0: torchfrtrace {tmp_path / 'logs'} -p nccl_trace_rank_"
    )
    assert e.rank == 1 and e.restartable
    reset_rank_files(tmp_path, range(2))  # a new attempt: nothing of the last one speaks for it
    assert not error_path(tmp_path, 1).exists() and not trace_path(tmp_path, 0).exists()
    said.clear()
    ranks_failed(Failure(1, "rank 1 was killed by SIGKILL", "killed", True), tmp_path, 2, said.append)
    assert said == [f"last lines of {tmp_path / 'logs' / 'rank00001.log'}:", "  last log line"]


def test_torch_diagnostics_are_on_by_default_and_a_users_value_wins(tmp_path):
    from torus_train.ranks.worker import torch_diagnostics

    environ: dict[str, str] = {"TORCH_FR_BUFFER_SIZE": "50"}
    torch_diagnostics(load_spec(None, [("comm.backend", "auto")]), tmp_path, 3, environ)
    assert environ == {
        "TORCH_FR_BUFFER_SIZE": "50",
        "TORCHELASTIC_ERROR_FILE": str(tmp_path / "logs" / "rank00003.error.json"),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "logs" / "nccl_trace_rank_"),
    }
    environ = {"TORCHELASTIC_ERROR_FILE": "/torchrun/agent/error.json"}
    torch_diagnostics(load_spec(None, [("comm.backend", "gloo")]), tmp_path, 3, environ)
    assert environ == {"TORCHELASTIC_ERROR_FILE": "/torchrun/agent/error.json"}  # gloo: no flight recorder
