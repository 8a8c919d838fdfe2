"""Start and watch processes: the local launcher's N ranks, or one mpirun/srun command (no torch import).

The local launcher starts each rank in its own session (so a rank's data-loader children can be killed with
it), sends its stderr (and stdout, except rank 0's) to OUT/logs/rankNNNNN.log, and polls. The first rank that
fails is reported (rank, exit code or signal, last lines of its log), the others get SIGTERM and, after a grace
period, SIGKILL; nothing is left behind. A rank that exits 0 without its .done marker ended too early and
counts as failed. SIGINT/SIGTERM to the launcher are forwarded to every rank.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable

from torus_train.errors import RunFailed
from torus_train.job.launch import LaunchPlan

GRACE_S = 10.0
POLL_S = 0.2


def _log(out: Path, rank: int) -> Path:
    return out / "logs" / f"rank{rank:05d}.log"


def _done(out: Path, rank: int) -> Path:
    return out / "logs" / f"rank{rank:05d}.done"


def tail(path: Path, lines: int = 8) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return [ln.rstrip("\n") for ln in deque(f, maxlen=lines)]
    except OSError:
        return []


def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(procs: list[subprocess.Popen], grace: float = GRACE_S) -> None:
    """SIGTERM every live process group, SIGKILL what is left after `grace` seconds, reap everything."""
    for p in procs:
        if p.poll() is None:
            # The rank alone: its data-loader workers must live until it has stopped cleanly (and checkpointed).
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            _signal_group(p, signal.SIGCONT)  # a stopped (hung) rank must run to see the SIGTERM
    end = time.time() + grace
    while time.time() < end and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    for p in procs:
        _signal_group(p, signal.SIGKILL)  # also the children of ranks that already exited
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class _Signals:
    """Turn SIGINT/SIGTERM into a flag the poll loop acts on (forwarding instead of dying at once)."""

    def __init__(self):
        self.got: int | None = None
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        self.got = signum

    def __exit__(self, *a):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def run_local(plan: LaunchPlan, out: Path, say: Callable[[str], None]) -> None:
    """Start the plan's ranks on this machine and wait; raise RunFailed naming the first rank that failed."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    files = []
    with _Signals() as sig:
        try:
            for rank, renv in enumerate(plan.rank_env):
                _done(out, rank).unlink(missing_ok=True)
                logf = open(_log(out, rank), "ab")
                files.append(logf)
                env = {**os.environ, **plan.env, **renv, "TORUS_TRAIN_LOG_REDIRECTED": "1"}
                procs.append(subprocess.Popen(plan.argv, env=env, stdin=subprocess.DEVNULL,
                                              stdout=None if rank == 0 else logf, stderr=logf,
                                              start_new_session=True))
            failure = _watch(procs, out, sig)
        finally:
            stop_all(procs, grace=GRACE_S)
            for f in files:
                f.close()
    if failure:
        rank, text = failure
        lines = tail(_log(out, rank))
        if lines:
            say(f"last lines of {_log(out, rank)}:")
            for ln in lines:
                say(f"  {ln}")
        raise RunFailed(text)


# Log lines of a rank that failed only because a peer went away: not the root cause.
PEER_LOST = ("connection closed", "connection reset", "connection refused", "broken pipe", "timed out",
             "timeout", "peer", "exited during", "died", "lost")


def root_cause(failed: dict[int, int], out: Path) -> int:
    """Among ranks that ended badly at about the same time, the one that most likely started it:
    killed by a signal first, then one whose log shows no lost-peer error, then the lowest rank."""
    def score(rank: int) -> tuple[int, int]:
        code = failed[rank]
        if code < 0:
            return 0, rank
        text = " ".join(tail(_log(out, rank), 30)).lower()
        return (2 if any(k in text for k in PEER_LOST) else 1), rank
    return min(failed, key=score)


def peer_lost(rank: int, out: Path) -> bool:
    """True when a rank's log ends with a lost-peer or timeout error (a symptom, not a cause)."""
    text = " ".join(tail(_log(out, rank), 30)).lower()
    return any(k in text for k in PEER_LOST)


def process_state(pid: int) -> str:
    """'stopped', 'running', 'sleeping', ... from /proc (Linux), else 'still alive'."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "still alive"
    return {"T": "stopped", "t": "stopped", "R": "running", "S": "sleeping", "D": "in uninterruptible wait",
            "Z": "exited"}.get(state, f"state {state}")


def _describe(rank: int, code: int, out: Path) -> str:
    if code == 0:
        return f"rank {rank} exited with code 0 before finishing"
    return f"rank {rank} {how_it_ended(code)}"


def _watch(procs: list[subprocess.Popen], out: Path, sig: _Signals) -> tuple[int, str] | None:
    while True:
        if sig.got is not None:
            name = signal.Signals(sig.got).name
            return -1, f"interrupted by {name}: forwarded to all {len(procs)} ranks, which were stopped"
        failed = _failed(procs, out)
        if failed:
            time.sleep(1.0)  # let the ranks that die of the same cause show up, then pick the root cause
            failed = _failed(procs, out)
            rank = root_cause(failed, out)
            alive = [r for r, p in enumerate(procs) if p.poll() is None]
            if alive and all(peer_lost(r, out) for r in failed):
                # Everyone that failed was waiting for a peer; the peer that neither failed nor progressed is
                # the one that hung (e.g. stopped, or stuck outside any collective).
                hung = alive[0]
                state = process_state(procs[hung].pid)
                return hung, (f"rank {hung} stopped responding (process {state}); rank(s) "
                              f"{', '.join(map(str, sorted(failed)))} timed out or lost the connection waiting for "
                              f"it (log: {_log(out, hung)}); stopped the other ranks")
            others = sorted(set(failed) - {rank})
            also = f"; then rank(s) {', '.join(map(str, others))} failed too" if others else ""
            return rank, (f"{_describe(rank, failed[rank], out)} (log: {_log(out, rank)}){also}; "
                          "stopped the other ranks")
        if all(p.poll() is not None for p in procs):
            return None
        time.sleep(POLL_S)


def _failed(procs: list[subprocess.Popen], out: Path) -> dict[int, int]:
    """rank -> exit code of every rank that failed so far (0 = exited without its .done marker)."""
    failed = {}
    for rank, p in enumerate(procs):
        code = p.poll()
        if code is not None and (code != 0 or not _done(out, rank).exists()):
            failed[rank] = code
    return failed


def run_command(argv: list[str], env: dict[str, str], what: str) -> None:
    """Run one launcher command (mpirun/srun) in its own session, forwarding SIGINT/SIGTERM; fail on non-zero."""
    with _Signals() as sig:
        p = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while p.poll() is None:
                if sig.got is not None:
                    _signal_group(p, sig.got)
                    try:
                        p.wait(timeout=GRACE_S)
                    except subprocess.TimeoutExpired:
                        pass
                    raise RunFailed(f"interrupted by {signal.Signals(sig.got).name}: forwarded to {what}")
                time.sleep(POLL_S)
        finally:
            if p.poll() is None:
                _signal_group(p, signal.SIGKILL)
                p.wait()
    if p.returncode != 0:
        raise RunFailed(f"{what} {how_it_ended(p.returncode)}; see the ranks' lines above and OUT/logs/")


def echo_err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
