"""The local launcher's watchdog, a rank's traceback in its log, and ranks dying with a SIGKILLed launcher.

Each test starts real ranks (gloo on CPU) through `python -m torus_train run` with a hard wall-clock guard, and
prints the seconds it measured (docs/faults.md quotes them)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .runhelp import TINY, leftover_workers, run_cli

pytestmark = pytest.mark.timeout(200)

TWO = [a if a not in ("4", "2x2") else {"4": "2", "2x2": "2x1"}[a] for a in TINY]  # 2 ranks: half the start-up


def beat(out: Path, rank: int) -> dict | None:
    try:
        return json.loads((out / "logs" / f"rank{rank:05d}.beat").read_text())
    except (OSError, ValueError):
        return None


def test_watchdog_names_the_rank_that_stopped_first_and_dumps_every_stack(tmp_path):
    """Rank 1 blocks in Python after step 3's exchange; the collective timeout (120 s) is far away, the
    watchdog (5 s) fires first: every rank's stack in its log, rank 1 named, the job ended."""
    out = tmp_path / "run"
    t = time.time()
    r = run_cli(
        *TINY,
        "--steps",
        "30",
        "--out",
        str(out),
        "--set",
        "comm.timeout_s=120",
        "--set",
        "launch.watchdog_s=5",
        env={"TORUS_TRAIN_FAULT": "hang:1:3"},
        timeout=150,
    )
    took = time.time() - t
    hung_at = max(beat(out, r)["time"] for r in range(4))  # the others finished step 3 as rank 1 hung
    print(f"hung rank -> watchdog: job ended {t + took - hung_at:.1f} s after the hang ({took:.1f} s in all)")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "watchdog: no rank finished a step for" in r.stderr, r.stderr
    assert "stopped first: rank 1 (last step 2, process sleeping); the others reached step 3" in r.stderr
    for rank in range(4):
        log = (out / "logs" / f"rank{rank:05d}.log").read_text()
        assert "most recent call first" in log, f"no stack dump in rank {rank}'s log"
    assert "in on_step" in (out / "logs" / "rank00001.log").read_text()  # where rank 1 hangs
    assert took < 120, took
    assert not leftover_workers(out)


def test_a_rank_failure_leaves_its_traceback_in_its_log(tmp_path):
    out = tmp_path / "run"
    r = run_cli(*TWO, "--steps", "4", "--out", str(out), env={"TORUS_TRAIN_FAULT": "start:1"}, timeout=120)
    assert r.returncode == 1
    log = (out / "logs" / "rank00001.log").read_text()
    assert "Traceback (most recent call last)" in log and "RunFailed: injected start-up failure" in log, log
    assert "NoneType: None" not in log
    assert json.loads((out / "logs" / "rank00001.failed").read_text())["kind"] == "verdict"
    recorded = json.loads((out / "logs" / "rank00001.error.json").read_text())["message"]  # torch's record
    assert recorded["message"] == "RunFailed: injected start-up failure"
    assert "Traceback (most recent call last)" in recorded["extraInfo"]["py_callstack"]


def test_ranks_die_with_a_sigkilled_launcher_and_keep_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "torus_train", "run", *TWO, "--steps", "500", "--out", str(out)]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not all((b := beat(out, r)) and b["step"] >= 2 for r in range(2)):
            assert time.time() < deadline and p.poll() is None, "the run did not start training"
            time.sleep(0.3)
        t = time.time()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        while leftover_workers(out) and time.time() - t < 60:
            time.sleep(0.2)
        took = time.time() - t
    finally:
        if p.poll() is None:
            p.kill()
    print(f"launcher SIGKILLed: no rank left after {took:.1f} s")
    assert not leftover_workers(out), leftover_workers(out)
    assert took < 30, took
    # The ranks got SIGTERM from the kernel (PR_SET_PDEATHSIG), stopped together and checkpointed.
    from torus_train.train.checkpoint import find_latest

    ref = find_latest(out / "checkpoints")
    assert ref is not None and ref.step >= 2
    assert "stopped by SIGTERM" in (out / "logs" / "rank00001.log").read_text()


@pytest.mark.slow
@pytest.mark.mpi
def test_watchdog_under_mpirun_gets_the_stacks_through_the_launcher(tmp_path):
    """mpirun passes SIGUSR1 on to every rank: the stacks reach the logs; the ranks' heartbeats in OUT/logs
    name the rank that stopped first; mpirun is stopped."""
    from .runhelp import mpi_available

    if not mpi_available():
        pytest.skip("no mpirun or mpi4py here")
    out = tmp_path / "run"
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    t = time.time()
    r = run_cli(
        *TWO,
        "--launcher",
        "mpirun",
        "--hostfile",
        str(hosts),
        "--steps",
        "30",
        "--out",
        str(out),
        "--set",
        "comm.timeout_s=120",
        "--set",
        "launch.watchdog_s=5",
        "--set",
        'launch.env=["TORUS_TRAIN_FAULT"]',
        env={"TORUS_TRAIN_FAULT": "hang:1:3"},
        timeout=170,
    )
    print(f"hung rank under mpirun -> watchdog: job ended after {time.time() - t:.1f} s (launch included)")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stopped first: rank 1 (last step 2); the others reached step 3" in r.stderr, r.stderr
    for rank in range(2):
        assert "most recent call first" in (out / "logs" / f"rank{rank:05d}.log").read_text()
    assert not leftover_workers(out)


def test_the_rank_still_alive_with_the_lowest_step_is_named_when_the_others_time_out(tmp_path):
    """Rank 2 of 4 blocks in Python (not stopped) after step 3's exchange; comm.timeout_s 5 ends the others
    first. Ranks 1, 2 and 3 may all still be alive then; the heartbeats single out rank 2 (last step 2)."""
    out = tmp_path / "run"
    r = run_cli(
        *TINY,
        "--steps",
        "30",
        "--out",
        str(out),
        "--set",
        "comm.timeout_s=5",
        env={"TORUS_TRAIN_FAULT": "hang:2:3"},
        timeout=150,
    )
    assert r.returncode == 1, r.stderr
    assert "rank 2 stopped responding (process sleeping)" in r.stderr, r.stderr
    assert not leftover_workers(out)


@pytest.mark.mpi
def test_mpirun_and_its_ranks_die_with_a_sigkilled_launcher(tmp_path):
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
        *TWO,
        "--launcher",
        "mpirun",
        "--hostfile",
        str(hosts),
        "--steps",
        "500",
        "--out",
        str(out),
    ]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not all((b := beat(out, r)) and b["step"] >= 2 for r in range(2)):
            assert time.time() < deadline and p.poll() is None, "the run did not start training"
            time.sleep(0.3)
        t = time.time()
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        while leftover_workers(out) and time.time() - t < 60:
            time.sleep(0.2)
        took = time.time() - t
    finally:
        if p.poll() is None:
            p.kill()
    print(f"launcher around mpirun SIGKILLed: no rank left after {took:.1f} s")
    assert not leftover_workers(out), leftover_workers(out)
    assert took < 30, took
