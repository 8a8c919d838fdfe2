"""Run a set of local rank processes without a job folder (benchmarks, tests), supervised like `run`'s ranks.

The first rank to fail is the root cause: it is named with its exit code or signal, the others are stopped
(SIGTERM, then SIGKILL after a grace period), and nothing is left behind. SIGINT and SIGTERM sent to the
supervisor are forwarded to every rank. The pieces are torus_train.ranks.runner's.
"""

from __future__ import annotations

import os
import subprocess
import time

from torus_train.errors import RunFailed
from torus_train.ranks.diagnosis import how_it_ended
from torus_train.ranks.runner import POLL_S, Signals, signal_group, stop_all


def run_local_ranks(argvs: list[list[str]], envs: list[dict], what: str = "job", grace: float = 5.0) -> int:
    """Start one process per (argv, env), inheriting stdout/stderr, and wait.

    Returns 0 when all succeed, 128+signal when interrupted; raises RunFailed naming the first failed rank.
    """
    procs: list[subprocess.Popen] = []
    with Signals() as sig:
        try:
            for argv, extra in zip(argvs, envs, strict=True):
                procs.append(
                    subprocess.Popen(
                        argv, env={**os.environ, **extra}, stdin=subprocess.DEVNULL, start_new_session=True
                    )
                )
            while True:
                if sig.got is not None:
                    for p in procs:
                        if p.poll() is None:
                            signal_group(p, sig.got)
                    return 128 + sig.got
                codes = [p.poll() for p in procs]
                for rank, code in enumerate(codes):
                    if code not in (None, 0):
                        name = f"rank {rank}" if len(procs) > 1 else "the launcher"
                        raise RunFailed(f"{what}: {name} {how_it_ended(code)}; the other ranks were stopped")
                if all(c == 0 for c in codes):
                    return 0
                time.sleep(POLL_S)
        finally:
            stop_all(procs, grace=grace)


__all__ = ["run_local_ranks"]
