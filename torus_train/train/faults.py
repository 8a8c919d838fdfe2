"""Fault injection for the launcher's and the loop's own tests: TORUS_TRAIN_FAULT=KIND:RANK:STEP (slow:RANK:SECONDS
for a straggler)."""
from __future__ import annotations

import os
import signal


def fault_here(kind: str, rank: int, step: int) -> bool:
    """Is this the rank and step at which TORUS_TRAIN_FAULT asks for a fault of ``kind``?"""
    fault = os.environ.get("TORUS_TRAIN_FAULT", "")
    return bool(fault) and fault == f"{kind}:{rank}:{step}"


def maybe_inject_fault(rank: int, step: int) -> None:
    """step:R:N kills rank R with SIGKILL after step N; stop:R:N freezes it with SIGSTOP; exit0:R:N exits it
    with code 0 (what a launcher that only checks exit codes would take for success)."""
    if fault_here("step", rank, step):
        os.kill(os.getpid(), signal.SIGKILL)
    if fault_here("stop", rank, step):
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault_here("exit0", rank, step):
        os._exit(0)


def slow_seconds(rank: int) -> float:
    """slow:R:SECONDS makes rank R a straggler: the loop sleeps that long in each of its steps, before backward
    (counted in its compute time, as a slow GPU or a throttled CPU would be). 0.0 on the other ranks."""
    parts = os.environ.get("TORUS_TRAIN_FAULT", "").split(":")
    if len(parts) != 3 or parts[0] != "slow" or parts[1] != str(rank):
        return 0.0
    try:
        seconds = float(parts[2])
    except ValueError:
        return 0.0
    return seconds if 0 < seconds < 3600 else 0.0
