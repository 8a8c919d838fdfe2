"""One run per output folder (ranks/claim.py): a claim held by a real process refuses a second run in one line
naming the holder; a holder killed by SIGKILL leaves nothing that keeps the folder; a note from another host
counts while it is fresh; job.json's temporary has a name of its own. Real processes and files, no mocks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from torus_train.errors import UserError
from torus_train.ranks import claim as claims
from torus_train.ranks.claim import CLAIM_FILE, STALE_S, claim_out
from torus_train.ranks.rundir import check_not_foreign, write_job

pytestmark = pytest.mark.timeout(60)

HOLD = (
    "import sys, time; from pathlib import Path; from torus_train.ranks.claim import claim_out; "
    "claim_out(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)"
)


def holder(out):
    """A process that claims out and keeps it until killed."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_claim_is_refused_naming_the_holder_until_it_is_killed(tmp_path):
    out = tmp_path / "O"
    p = holder(out)
    try:
        with pytest.raises(UserError) as e:
            claim_out(out)
        line = str(e.value)
        assert "\n" not in line and f"--out {out}: in use by the run started " in line
        assert f"on {socket.gethostname()} (pid {p.pid})" in line and "give another --out" in line
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    left = json.loads((out / CLAIM_FILE).read_text())
    assert left["pid"] == p.pid  # a killed holder leaves its note, but not its lock
    c = claim_out(out)
    assert json.loads((out / CLAIM_FILE).read_text())["pid"] == os.getpid()
    c.release()
    assert os.listdir(out) == []  # the note goes with the claim; the folder existed before this claim


def test_release_removes_a_folder_the_claim_made_and_left_empty(tmp_path):
    made = claim_out(tmp_path / "new")
    made.release()
    assert not (tmp_path / "new").exists()
    used = claim_out(tmp_path / "used")
    (tmp_path / "used" / "logs").mkdir()
    used.release()
    assert os.listdir(tmp_path / "used") == ["logs"]
    # the parents it made go too (a run refused after the claim, `--resume` of nothing, leaves no `runs/`),
    # up to the first folder that existed or that the run wrote into
    deep = claim_out(tmp_path / "runs" / "a" / "b")
    deep.release()
    assert not (tmp_path / "runs").exists()
    kept = claim_out(tmp_path / "runs" / "a" / "b")
    (tmp_path / "runs" / "a" / "other").mkdir()
    kept.release()
    assert os.listdir(tmp_path / "runs" / "a") == ["other"]


def note(out, host: str, age: float, job: str = "") -> None:
    out.mkdir(exist_ok=True)
    path = out / CLAIM_FILE
    path.write_text(json.dumps({"host": host, "pid": 4242, "started": "then", **({"job": job} if job else {})}))
    os.utime(path, (time.time() - age, time.time() - age))


def test_a_fresh_note_from_another_host_is_a_claim_a_stale_one_is_not(tmp_path):
    """Where locks stay on one node (NFS nolock, Lustre localflock) the lock here is free although a run on
    another node holds the folder: its refreshed note says so; one not refreshed for STALE_S is a dead run's."""
    out = tmp_path / "O"
    note(out, "node-b", age=10)
    with pytest.raises(UserError, match=r"in use by the run started then on node-b \(pid 4242\)"):
        claim_out(out)
    note(out, "node-b", age=STALE_S + 1)
    claim_out(out).release()
    note(out, "node-b", age=10, job="TORCHELASTIC_RUN_ID=r1")  # an earlier attempt of this very job
    claim_out(out, job="TORCHELASTIC_RUN_ID=r1").release()


def test_without_locks_a_live_pid_on_this_host_holds_the_folder(tmp_path, monkeypatch):
    """A file system that refuses flock (Lustre without -o flock): the note decides, by the pid on this host."""

    def no_locks(fd, op):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(claims.fcntl, "flock", no_locks)
    out = tmp_path / "O"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        out.mkdir()
        (out / CLAIM_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": sleeper.pid, "started": "x"}))
        with pytest.raises(UserError, match=f"pid {sleeper.pid}"):
            claim_out(out)
    finally:
        sleeper.kill()
        sleeper.wait()
    claim_out(out).release()


def test_a_fifo_in_place_of_the_claim_file_is_refused_not_waited_on(tmp_path):
    out = tmp_path / "O"
    out.mkdir()
    os.mkfifo(out / CLAIM_FILE)
    with pytest.raises(UserError, match="not a regular file"):
        claim_out(out)


def test_job_json_is_written_through_a_temporary_of_its_own(tmp_path, monkeypatch):
    """Two writers of one job.json never share a temporary (a fixed job.tmp let one job read the other's)."""
    from torus_train.job.spec import load_spec
    from torus_train.job.topology import Grid

    spec = load_spec(None, [("data.source", "synthetic")])
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: renamed.append(os.path.basename(a)) or real_replace(a, b))
    for _ in range(2):
        write_job(tmp_path / "job.json", spec, Grid(1, 1, 1), resume=False)
    assert len(set(renamed)) == 2 and all(n.startswith("job.json.") and n.endswith(".tmp") for n in renamed)
    assert sorted(os.listdir(tmp_path)) == ["job.json"]
    (tmp_path / renamed[0]).write_text("{}")  # one a killed launcher left is still a run's entry
    check_not_foreign(tmp_path, "--out")
    (tmp_path / "job.json.mine").write_text("{}")
    with pytest.raises(UserError, match="not a torus-train run's"):
        check_not_foreign(tmp_path, "--out")
