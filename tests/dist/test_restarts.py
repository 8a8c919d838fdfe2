"""`torus-train run --max-restarts N`: a rank killed mid-run, the job restarted from its latest checkpoint and
finished with the same parameters as an undisturbed run; what is not restarted. Real ranks, hard time guards."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from .runhelp import leftover_workers, run_cli, summary
from .test_watchdog import TWO, beat

pytestmark = pytest.mark.timeout(300)

COMMON = [*TWO, "--steps", "10", "--set", "checkpoint.every_steps=2"]


def kill_rank_after(argv: list[str], out, step: int, env: dict | None = None) -> tuple[int, str, str, dict]:
    """Start the job argv, SIGKILL rank 1 once its heartbeat says ``step`` or later, wait for the job's end:
    (exit code, stdout, stderr, the beat the kill read, with the kill's time as "killed_at")."""
    p = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )
    try:
        deadline = time.time() + 120
        while not ((b := beat(out, 1)) and b["step"] >= step):
            assert time.time() < deadline and p.poll() is None, "the run did not start training"
            time.sleep(0.05)
        b["killed_at"] = time.time()
        os.kill(b["pid"], signal.SIGKILL)
        stdout, stderr = p.communicate(timeout=200)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, stdout, stderr, b


@pytest.mark.slow
def test_a_killed_rank_is_restarted_and_the_job_ends_as_if_undisturbed(tmp_path):
    straight, restarted = tmp_path / "straight", tmp_path / "restarted"
    r = run_cli(*COMMON, "--out", str(straight), timeout=150)
    assert r.returncode == 0, r.stderr
    argv = [sys.executable, "-m", "torus_train", "run", *COMMON, "--out", str(restarted), "--max-restarts", "2"]
    code, stdout, stderr, b = kill_rank_after(argv, restarted, 4)
    took = time.time() - b["killed_at"]
    print(f"rank killed at step >= {b['step']}: job finished {took:.1f} s later")
    assert code == 0, stdout + stderr
    line = next(ln for ln in stderr.splitlines() if "restart 1 of 2" in ln)
    assert (
        line.startswith("rank 1 was killed by SIGKILL (last heartbeat at step ")
        and "from the checkpoint at step " in line
    )
    step = int(line.split("from the checkpoint at step ")[1])
    assert step >= 2 and f"resumed at epoch 0, step {step}" in stdout
    s, ref = summary(restarted), summary(straight)
    assert (s["steps"], s["param_digests_agree"]) == (10, True)
    assert s["param_digest"] == ref["param_digest"], "the restarted job ended with other parameters"
    assert not leftover_workers(restarted)


@pytest.mark.slow
def test_a_restart_before_the_first_checkpoint_starts_again_and_writes_each_step_once(tmp_path):
    """Rank 1 killed at step >= 3 of 10 with a checkpoint every 8: the restart starts from step 0, the first
    attempt's metrics lines go, and the job ends as an undisturbed one."""
    from .runhelp import metrics

    straight, restarted = tmp_path / "straight", tmp_path / "restarted"
    args = [*COMMON[:-1], "checkpoint.every_steps=8"]
    r = run_cli(*args, "--out", str(straight), timeout=150)
    assert r.returncode == 0, r.stderr
    argv = [sys.executable, "-m", "torus_train", "run", *args, "--out", str(restarted), "--max-restarts", "1"]
    # rank 1 slowed to 0.3 s a step: its heartbeat (at most once a second) must show a step before 8, where the
    # first checkpoint is; on an idle machine the unslowed run passed step 8 before the first beat was read
    code, stdout, stderr, _ = kill_rank_after(argv, restarted, 3, env={"TORUS_TRAIN_FAULT": "slow:1:0.3"})
    assert code == 0, stdout + stderr
    assert "restart 1 of 1 from the start (no checkpoint yet)" in stderr
    assert "no checkpoint yet: started again (" in stdout and "metrics lines of the earlier attempt dropped" in stdout
    steps = [m["step"] for m in metrics(restarted) if "loss" in m]
    assert steps == [2, 4, 6, 8, 10], steps
    assert summary(restarted)["param_digest"] == summary(straight)["param_digest"]
    assert not leftover_workers(restarted)


def test_a_rank_that_keeps_failing_exhausts_the_restarts(tmp_path):
    """step:1:3 kills rank 1 after step 3 in every attempt (each resumes from step 2): one restart, then
    the launcher gives up and says so."""
    out = tmp_path / "run"
    t = time.time()
    r = run_cli(*COMMON, "--out", str(out), "--max-restarts", "1", env={"TORUS_TRAIN_FAULT": "step:1:3"}, timeout=200)
    print(f"rank killed in every attempt: gave up after {time.time() - t:.1f} s")
    assert r.returncode == 1
    # the step comes from rank 1's heartbeat, written at most once a second: step 3 or one up to a second before
    m = re.search(
        r"rank 1 was killed by SIGKILL \(last heartbeat at step (\d)\); restart 1 of 1 from the "
        r"checkpoint at step 2",
        r.stderr,
    )
    assert m and 1 <= int(m.group(1)) <= 3, r.stderr
    assert "gave up after 1 restart(s)" in r.stderr.splitlines()[-1]
    assert not leftover_workers(out)


@pytest.mark.parametrize(
    "fault, why",
    [
        ("start:1", "not restarted: this failure would repeat"),  # the rank's own verdict, before any step
    ],
)
def test_what_is_not_restarted(tmp_path, fault, why):
    out = tmp_path / "run"
    r = run_cli(*COMMON, "--out", str(out), "--max-restarts", "2", env={"TORUS_TRAIN_FAULT": fault}, timeout=120)
    assert r.returncode == 1 and why in r.stderr, r.stderr
    assert "restart 1 of" not in r.stderr


def test_bad_input_is_never_launched_or_restarted(tmp_path):
    r = run_cli(*COMMON, "--out", str(tmp_path / "run"), "--max-restarts", "2", "--data", str(tmp_path / "none"))
    assert r.returncode == 2 and "no such folder" in r.stderr and "restart" not in r.stderr
    r = run_cli(*COMMON, "--out", str(tmp_path / "run"), "--max-restarts", "-1")
    assert r.returncode == 2 and "--max-restarts" in r.stderr


@pytest.mark.slow
def test_elastic_drops_a_node_that_keeps_failing_and_keeps_the_global_batch(tmp_path):
    """4 ranks as 2 nodes of 2 (--gpus-per-node 2); rank 3 is killed after step 3 in every attempt. Restart 1
    from step 2 fails the same way, so node 1 is dropped: 2 ranks on grid 2x1 finish the job, each rank
    running its 32 samples as 2 micro-batches of 16 (the micro-batch it had), global batch 64 throughout."""
    from .runhelp import TINY, metrics

    out = tmp_path / "run"
    t = time.time()
    r = run_cli(
        *TINY,
        "--gpus-per-node",
        "2",
        "--steps",
        "6",
        "--set",
        "checkpoint.every_steps=2",
        "--out",
        str(out),
        "--max-restarts",
        "2",
        "--elastic",
        env={"TORUS_TRAIN_FAULT": "step:3:3"},
        timeout=280,
    )
    print(f"elastic: node lost for good, job finished on the remaining node after {time.time() - t:.1f} s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restart 1 of 2 from the checkpoint at step 2" in r.stderr
    assert (
        "node 1 (ranks 2-3) failed in two attempts in a row: continuing without it on 2 ranks, grid 2x1; the "
        "global batch stays 64 (2 ranks x 16 x 2 accumulated) and so does the learning-rate schedule"
    ) in r.stderr
    s = summary(out)
    assert (s["world_size"], s["grid"], s["steps"], s["param_digests_agree"]) == (2, "2x1", 6, True)
    steps = [m for m in metrics(out) if "loss" in m and "step" in m]
    assert {m["global_batch"] for m in steps} == {64} and steps[-1]["step"] == 6
    assert not leftover_workers(out)


def test_elastic_is_refused_where_it_cannot_work(tmp_path):
    r = run_cli(*COMMON, "--out", str(tmp_path / "run"), "--elastic", "--max-restarts", "1")
    assert r.returncode == 2 and "--elastic needs --max-restarts 2" in r.stderr


@pytest.mark.slow
@pytest.mark.mpi
def test_restart_under_mpirun(tmp_path):
    """mpirun ends the whole step when rank 1 is SIGKILLed; the launcher judges the step from mpirun's lines and
    OUT/logs and runs mpirun again with --resume."""
    from .runhelp import mpi_available

    if not mpi_available():
        pytest.skip("no mpirun or mpi4py here")
    out, hosts = tmp_path / "run", tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    argv = [
        sys.executable,
        "-m",
        "torus_train",
        "run",
        *COMMON,
        "--launcher",
        "mpirun",
        "--hostfile",
        str(hosts),
        "--out",
        str(out),
        "--max-restarts",
        "1",
    ]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not ((b := beat(out, 1)) and b["step"] >= 4):
            assert time.time() < deadline and p.poll() is None, "the run did not start training"
            time.sleep(0.1)
        os.kill(b["pid"], signal.SIGKILL)
        stdout, stderr = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, stdout[-3000:] + stderr[-3000:]
    # mpirun names the rank and its host in its own last lines
    assert re.search(
        r"rank 1 on \S+ was killed by SIGKILL \(last heartbeat at step \d+\); restart 1 of 1 from the "
        r"checkpoint at step \d+",
        stderr,
    ), stderr[-3000:]
    assert stdout.count("$ mpirun ") == 2
    s = summary(out)
    assert (s["steps"], s["param_digests_agree"]) == (10, True)
    assert not leftover_workers(out)
