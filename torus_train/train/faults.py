"""Fault injection for the launcher's and the loop's own tests: TORUS_TRAIN_FAULT=KIND:RANK:STEP."""
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
