"""Faults injected from outside into a running 2-rank job, as they happen on a cluster: a rank SIGKILLed, a rank
frozen with SIGSTOP, SIGTERM to the launcher. Each measures the seconds from the fault to the end of the job
(docs/faults.md quotes them) under a hard wall-clock guard, and checks that no rank is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from .runhelp import leftover_workers
from .test_watchdog import TWO, beat

pytestmark = pytest.mark.timeout(200)


def start_and_wait(out, *extra: str) -> subprocess.Popen:
    """A 2-rank job of 500 steps, returned once both ranks finished step 2."""
    argv = [sys.executable, "-m", "torus_train", "run", *TWO, "--steps", "500", "--out", str(out), *extra]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not all((b := beat(out, r)) and b["step"] >= 2 for r in range(2)):
        if time.time() > deadline or p.poll() is not None:
            p.kill()
            pytest.fail(f"the run did not start training: {p.communicate()[1][-2000:]}")
        time.sleep(0.2)
    return p


def ended(p: subprocess.Popen, t: float, what: str) -> tuple[str, float]:
    try:
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    took = time.time() - t
    print(f"{what}: job ended {took:.1f} s after the fault, exit {p.returncode}")
    return err, took


def test_rank_sigkilled(tmp_path):
    out = tmp_path / "run"
    p = start_and_wait(out)
    t = time.time()
    os.kill(beat(out, 1)["pid"], signal.SIGKILL)
    err, took = ended(p, t, "rank 1 SIGKILLed")
    assert p.returncode == 1 and "rank 1 was killed by SIGKILL" in err, err
    assert took < 30 and not leftover_workers(out)


def test_rank_sigstopped_is_named_after_the_collective_timeout(tmp_path):
    out = tmp_path / "run"
    p = start_and_wait(out, "--set", "comm.timeout_s=5")
    t = time.time()
    os.kill(beat(out, 1)["pid"], signal.SIGSTOP)
    err, took = ended(p, t, "rank 1 SIGSTOPped (comm.timeout_s 5)")
    assert p.returncode == 1 and "rank 1 stopped responding (process stopped)" in err, err
    assert took < 45 and not leftover_workers(out)


def test_sigterm_to_the_launcher(tmp_path):
    out = tmp_path / "run"
    p = start_and_wait(out)
    t = time.time()
    p.send_signal(signal.SIGTERM)
    err, took = ended(p, t, "SIGTERM to the launcher")
    assert p.returncode == 1 and "interrupted by SIGTERM" in err, err
    assert took < 30 and not leftover_workers(out)
    from torus_train.train.checkpoint import find_latest

    assert find_latest(out / "checkpoints").step >= 2  # the ranks stopped together after a checkpoint
