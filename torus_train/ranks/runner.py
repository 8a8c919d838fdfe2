"""Start and watch processes: the local launcher's N ranks, or one mpirun/srun command (no torch import).

The local launcher starts each rank in its own session (so a rank's data-loader children can be killed with
it), sends its stderr (and stdout, except rank 0's) to OUT/logs/rankNNNNN.log, and polls. The first rank that
fails is reported (rank, exit code or signal, last lines of its log; ranks/diagnosis.py), the others get
SIGTERM and, after a grace period, SIGKILL; nothing is left behind. A rank that exits 0 without its .done
marker ended too early and counts as failed. SIGINT/SIGTERM to the launcher are forwarded to every rank.
Both kinds of launch are watched by the watchdog (ranks/watchdog.py) when it is on.

A failure comes back as ``RanksFailed`` (ranks/diagnosis.py), which also says whether a restart from the
latest checkpoint could help (``restartable``) and at which step the failed rank was.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from torus_train.errors import RunFailed
from torus_train.job.launch import LaunchPlan
from torus_train.ranks.diagnosis import (
    GRACE_S,
    Failure,
    RanksFailed,
    diagnose,
    done_path,
    failed_path,
    failed_ranks,
    how_it_ended,
    log_path,
    ranks_failed,
    reset_rank_files,
)
from torus_train.ranks.heartbeat import PARENT_ENV, PR_SET_PDEATHSIG
from torus_train.ranks.watchdog import Watch, check_progress, new_watch, stall, stalled

ENDED_GRACE_S = 30.0  # how long mpirun/srun may take to exit after every rank has ended
POLL_S = 0.2


def signal_group(p: subprocess.Popen, sig: int) -> None:
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
            signal_group(p, signal.SIGCONT)  # a stopped (hung) rank must run to see the SIGTERM
    end = time.time() + grace
    while time.time() < end and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    for p in procs:
        signal_group(p, signal.SIGKILL)  # also the children of ranks that already exited
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class Signals:
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


# --------------------------------------------------------------------------------------------------------
# The local launcher
# --------------------------------------------------------------------------------------------------------
def run_local(
    plan: LaunchPlan, out: Path, say: Callable[[str], None], watchdog_s: float = 0.0, startup_s: float = 0.0
) -> None:
    """Start the plan's ranks on this machine and wait; raise RanksFailed naming the first rank that failed.

    watchdog_s: seconds without a finished step on any rank before the job is ended (0: no watchdog);
    startup_s: the limit until every rank has finished a step (at least watchdog_s)."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    n = len(plan.rank_env)
    reset_rank_files(out, range(n))
    procs: list[subprocess.Popen] = []
    failure = None
    with Signals() as sig, contextlib.ExitStack() as logs:  # the logs close after the ranks are stopped
        try:
            for rank, renv in enumerate(plan.rank_env):
                logf = logs.enter_context(open(log_path(out, rank), "ab"))
                env = {
                    **os.environ,
                    **plan.env,
                    **renv,
                    "TORUS_TRAIN_LOG_REDIRECTED": "1",
                    PARENT_ENV: str(os.getpid()),
                }
                procs.append(
                    subprocess.Popen(
                        plan.argv,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=None if rank == 0 else logf,
                        stderr=logf,
                        start_new_session=True,
                    )
                )
            failure = watch_ranks(procs, out, sig, new_watch(watchdog_s, startup_s))
        finally:
            stop_all(procs, grace=failure.grace if failure else GRACE_S)
    if failure:
        raise ranks_failed(failure, out, n, say)


def watch_ranks(procs: list[subprocess.Popen], out: Path, sig: Signals, watch: Watch | None) -> Failure | None:
    """Poll the local ranks until all have succeeded (None), one failed, the watchdog fired or the launcher
    got SIGINT/SIGTERM (the Failure)."""
    while True:
        if sig.got is not None:
            name = signal.Signals(sig.got).name
            text = f"interrupted by {name}: forwarded to all {len(procs)} ranks, which were stopped"
            return Failure(-1, text, text, False)
        failed = failed_ranks(procs, out)
        if failed:
            time.sleep(1.0)  # let the ranks that die of the same cause show up, then pick the root cause
            return diagnose(procs, out, failed_ranks(procs, out))
        if all(p.poll() is not None for p in procs):
            return None
        if watch is not None and (hung := check_progress(procs, out, watch)) is not None:
            return hung
        time.sleep(POLL_S)


# --------------------------------------------------------------------------------------------------------
# One mpirun or srun command
# --------------------------------------------------------------------------------------------------------
def run_command(
    argv: list[str], env: dict[str, str], what: str, out: Path | None = None, ranks: int = 0, watch: Watch | None = None
) -> None:
    """Run one launcher command (mpirun/srun) in its own session, forwarding SIGINT/SIGTERM; fail on non-zero.

    Its stderr passes through to ours, and its last lines are kept: mpirun and srun name the rank (and host)
    that ended the step there (``diagnosis.culprit``). With `watch` (and the ranks' OUT/logs on a shared
    folder) the watchdog reads the ranks' heartbeats; when it fires, SIGUSR1 to the launcher command (mpirun
    and srun pass it on to every rank: stacks into the logs), then the command is stopped and RanksFailed
    names the ranks that stopped first."""
    with Signals() as sig:
        p = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=term_with_parent,
        )
        said, reader = pass_through(p.stderr)
        try:
            while p.poll() is None:
                check_command(p, what, sig, out, ranks, watch)
                time.sleep(POLL_S)
        finally:
            if p.poll() is None:
                signal_group(p, signal.SIGKILL)
                p.wait()
    reader.join(timeout=5)  # the command's last lines
    if p.returncode != 0:
        raise CommandFailed(
            f"{what} {how_it_ended(p.returncode)}; see the ranks' lines above and OUT/logs/", list(said)
        )


def check_command(
    p: subprocess.Popen, what: str, sig: Signals, out: Path | None, ranks: int, watch: Watch | None
) -> None:
    """One poll of a running launcher command: RunFailed when this launcher got SIGINT/SIGTERM (forwarded to
    the command) or when every rank has ended but the command does not exit; RanksFailed when the watchdog
    fires. The command is stopped first in each case."""
    if sig.got is not None:
        signal_group(p, sig.got)
        try:
            p.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        raise RunFailed(f"interrupted by {signal.Signals(sig.got).name}: forwarded to {what}")
    if out is not None and ranks and (late := all_ended_for(out, ranks)) > ENDED_GRACE_S:
        # every rank has left its last word, yet mpirun/srun waits: typically for the daemon of a node it can
        # no longer reach (a partition); it would wait until the link comes back
        stop_all([p], grace=GRACE_S)
        raise RunFailed(
            f"all {ranks} ranks ended {late:.0f} s ago (see OUT/logs/) but {what} did not exit (a "
            f"node it cannot reach?); stopped it"
        )
    if (
        watch is not None
        and out is not None
        and (found := stall(out, ranks, watch, lambda: p.send_signal(signal.SIGUSR1)))
    ):
        f = stalled(out, ranks, *found, {})
        stop_all([p], grace=f.grace)
        raise RanksFailed(f.text, f.rank, found[0][f.rank].step if f.rank in found[0] else -1, True, True, f.how)


def all_ended_for(out: Path, ranks: int) -> float:
    """Seconds since the last of `ranks` ranks left its .done or .failed marker; 0 while any has not (the
    first rank without one ends the scan, so a running job costs a file check or two per poll)."""
    stamps = []
    for rank in range(ranks):
        marks = [m for m in (done_path(out, rank), failed_path(out, rank)) if m.exists()]
        try:
            stamps.append(max(m.stat().st_mtime for m in marks))
        except (OSError, ValueError):  # no marker yet, or one just removed
            return 0.0
    return max(0.0, time.time() - max(stamps))


def term_with_parent() -> None:
    """In the launcher command's child before exec: SIGTERM when this launcher dies (even by SIGKILL); mpirun and
    srun then end their ranks. Linux only; elsewhere nothing."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class CommandFailed(RunFailed):
    """mpirun/srun ended non-zero; `lines` are the last lines it wrote to stderr."""

    def __init__(self, text: str, lines: list[str]):
        super().__init__(text)
        self.lines = lines


def pass_through(stream, keep: int = 60):
    """Copy a command's stderr to ours line by line in a thread: (the last `keep` lines, the thread)."""
    last: deque = deque(maxlen=keep)

    def copy() -> None:
        for raw in iter(stream.readline, b""):
            sys.stderr.write(raw.decode(errors="replace"))
            sys.stderr.flush()
            last.append(raw.decode(errors="replace").rstrip("\n"))

    reader = threading.Thread(target=copy, name="launcher-stderr", daemon=True)
    reader.start()
    return last, reader


def echo_err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
