"""Start and watch processes: the local launcher's N ranks, or one mpirun/srun command (no torch import).

The local launcher starts each rank in its own session (so a rank's data-loader children can be killed with
it), sends its stderr (and stdout, except rank 0's) to OUT/logs/rankNNNNN.log, and polls. The first rank that
fails is reported (rank, exit code or signal, last lines of its log), the others get SIGTERM and, after a grace
period, SIGKILL; nothing is left behind. A rank that exits 0 without its .done marker ended too early and
counts as failed. SIGINT/SIGTERM to the launcher are forwarded to every rank.

The watchdog: every rank rewrites a heartbeat file with the last step it finished (ranks/heartbeat.py). When
no rank has finished a step for ``watchdog_s`` seconds (before every rank's first step: at least the start-up
limit, the collective timeout plus a margin), the launcher has each rank dump the Python stack of all its
threads into its log (SIGUSR1, faulthandler), names the ranks that stopped progressing first (the lowest last
step) and ends the job. A failure comes back as ``RanksFailed``, which also says whether a restart from the
latest checkpoint could help (``restartable``) and at which step the failed rank was.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from torus_train.errors import RunFailed
from torus_train.job.launch import LaunchPlan
from torus_train.ranks.heartbeat import (PARENT_ENV, PR_SET_PDEATHSIG, Beat, beat_interval, clear_beats,
                                         first_stopped, read_beats)

GRACE_S = 10.0
ENDED_GRACE_S = 30.0  # how long mpirun/srun may take to exit after every rank has ended
POLL_S = 0.2
HUNG_GRACE_S = 2.0
"""After the watchdog's verdict the ranks are stuck: no clean stop with a checkpoint is to be had."""
DUMP_WAIT_S = 2.0
"""How long the ranks get to write their stacks after SIGUSR1."""
RESTARTABLE = ("crash",)
"""Kinds of a rank's own failure (its .failed marker) that a restart may cure; input errors, a stop asked for
by a signal and the job's own verdicts (diverged replicas, non-finite loss, a bad checkpoint) would repeat."""


def new_watch(watchdog_s: float, startup_s: float) -> "Watch | None":
    return Watch(watchdog_s, startup_s, {}, time.time()) if watchdog_s > 0 else None


class RanksFailed(RunFailed):
    """The ranks failed after launch. `rank` is the root cause, `step` the last step it finished (-1: none),
    `restartable` whether starting again from the latest checkpoint could help, `progressed` whether any rank
    finished a step in this attempt."""

    def __init__(self, text: str, rank: int = -1, step: int = -1, restartable: bool = False,
                 progressed: bool = False, how: str = ""):
        super().__init__(text)
        self.rank, self.step, self.restartable, self.progressed = rank, step, restartable, progressed
        self.how = how or text


@dataclass
class Failure:
    """What the poll loop saw: the root-cause rank, the line for the user, and how it ended."""

    rank: int
    text: str
    how: str
    """'rank 3 was killed by SIGKILL', 'rank 1 stopped responding', ... (for the restart line)."""
    restartable: bool
    grace: float = GRACE_S
    """Seconds the ranks get to stop after SIGTERM; short once the watchdog found them hung."""


@dataclass
class Watch:
    """The watchdog's state: the last (rank, step) set seen and when it last changed."""

    limit_s: float
    startup_s: float
    seen: dict
    changed: float
    read_at: float = 0.0

    def due(self, now: float, ranks: int) -> bool:
        started = len(self.seen) == ranks and all(b.step >= 0 for b in self.seen.values())
        limit = self.limit_s if started else max(self.limit_s, self.startup_s)
        return now - self.changed > limit


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


def run_local(plan: LaunchPlan, out: Path, say: Callable[[str], None], watchdog_s: float = 0.0,
              startup_s: float = 0.0) -> None:
    """Start the plan's ranks on this machine and wait; raise RanksFailed naming the first rank that failed.

    watchdog_s: seconds without a finished step on any rank before the job is ended (0: no watchdog);
    startup_s: the limit until every rank has finished a step (at least watchdog_s)."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    n = len(plan.rank_env)
    reset_rank_files(out, n)
    procs: list[subprocess.Popen] = []
    files = []
    failure = None
    with _Signals() as sig:
        try:
            for rank, renv in enumerate(plan.rank_env):
                logf = open(_log(out, rank), "ab")
                files.append(logf)
                env = {**os.environ, **plan.env, **renv, "TORUS_TRAIN_LOG_REDIRECTED": "1",
                       PARENT_ENV: str(os.getpid())}
                procs.append(subprocess.Popen(plan.argv, env=env, stdin=subprocess.DEVNULL,
                                              stdout=None if rank == 0 else logf, stderr=logf,
                                              start_new_session=True))
            failure = _watch(procs, out, sig, new_watch(watchdog_s, startup_s))
        finally:
            stop_all(procs, grace=failure.grace if failure else GRACE_S)
            for f in files:
                f.close()
    if failure:
        raise _ranks_failed(failure, out, n, say)


def _ranks_failed(failure: Failure, out: Path, ranks: int, say: Callable[[str], None]) -> RanksFailed:
    # a rank that named its own failure (bad input, a failed check, a stop) gets that one line; the log's tail
    # (with its traceback) is for crashes and deaths
    told = failure_message(out, failure.rank) if failure.rank >= 0 else ""
    if not told and failure.rank >= 0:
        told = mark_comm_failure(out, failure.rank)
    if told:
        say(f"torus-train: rank {failure.rank} failed: {told}")
    lines = tail(_log(out, failure.rank)) if failure.rank >= 0 and not told else []
    if lines:
        say(f"last lines of {_log(out, failure.rank)}:")
        for ln in lines:
            say(f"  {ln}")
    beats = read_beats(out, ranks)
    step = beats[failure.rank].step if failure.rank in beats else -1
    progressed = any(b.step >= 0 for b in beats.values())
    return RanksFailed(failure.text, failure.rank, step, failure.restartable, progressed, failure.how)


def reset_rank_files(out: Path, ranks: int) -> None:
    """Before an attempt: no .done, .failed or .beat file of an earlier one may speak for this one."""
    clear_beats(out, ranks)
    for rank in range(ranks):
        _done(out, rank).unlink(missing_ok=True)
        _failed_marker(out, rank).unlink(missing_ok=True)


def _failed_marker(out: Path, rank: int) -> Path:
    return out / "logs" / f"rank{rank:05d}.failed"


def failure_kind(out: Path, rank: int) -> str:
    """The kind a rank gave its own failure (input, stopped, verdict, crash), or '' if it said nothing."""
    import json

    try:
        return str(json.loads(_failed_marker(out, rank).read_text()).get("kind", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def mark_comm_failure(out: Path, rank: int, lines: int = 60) -> str:
    """A rank that died without its .failed marker (NCCL's watchdog aborts the process before Python runs) but
    whose log tail holds gloo's or NCCL's words for a failed collective: the marker is written for it (kind
    crash, restartable) and its one line returned; '' otherwise."""
    import json

    from torus_train.errors import comm_failure

    if _failed_marker(out, rank).exists():
        return ""
    said = comm_failure("\n".join(tail(_log(out, rank), lines)))
    if said is None:
        return ""
    try:
        _failed_marker(out, rank).write_text(json.dumps({"rank": rank, "kind": "crash", "message": said,
                                                          "written_by": "launcher, from the log"}))
    except OSError:
        pass
    return said


def failure_message(out: Path, rank: int) -> str:
    """The one line a rank gave a failure it recognised (input, verdict, stopped); '' for a crash or none."""
    import json

    try:
        d = json.loads(_failed_marker(out, rank).read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(d, dict) or d.get("kind") not in ("input", "verdict", "stopped"):
        return ""
    return str(d.get("message", "")).splitlines()[0] if d.get("message") else ""


def restartable(code: int, kind: str) -> bool:
    """A rank killed by a signal, exited 0 too early, or crashed (or died without saying why): a restart may
    cure it. Bad input, a requested stop and the job's own verdicts would fail again the same way."""
    if code < 0 or code == 0 or not kind:
        return True
    return kind in RESTARTABLE


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


def _watch(procs: list[subprocess.Popen], out: Path, sig: _Signals, watch: Watch | None) -> Failure | None:
    while True:
        if sig.got is not None:
            name = signal.Signals(sig.got).name
            text = f"interrupted by {name}: forwarded to all {len(procs)} ranks, which were stopped"
            return Failure(-1, text, text, False)
        failed = _failed(procs, out)
        if failed:
            time.sleep(1.0)  # let the ranks that die of the same cause show up, then pick the root cause
            return _diagnose(procs, out, _failed(procs, out))
        if all(p.poll() is not None for p in procs):
            return None
        if watch is not None and (hung := _check_progress(procs, out, watch)) is not None:
            return hung
        time.sleep(POLL_S)


def _diagnose(procs: list[subprocess.Popen], out: Path, failed: dict[int, int]) -> Failure:
    rank = root_cause(failed, out)
    alive = [r for r, p in enumerate(procs) if p.poll() is None]
    if alive and all(peer_lost(r, out) for r in failed):
        # Everyone that failed was waiting for a peer; the peer that neither failed nor progressed is
        # the one that hung (e.g. stopped, or stuck outside any collective).
        hung = likely_hung(procs, out, alive)
        state = process_state(procs[hung].pid)
        how = f"rank {hung} stopped responding (process {state})"
        return Failure(hung, f"{how}; rank(s) {', '.join(map(str, sorted(failed)))} timed out or lost the "
                             f"connection waiting for it (log: {_log(out, hung)}); stopped the other ranks", how, True)
    others = sorted(set(failed) - {rank})
    also = f"; then rank(s) {', '.join(map(str, others))} failed too" if others else ""
    how = _describe(rank, failed[rank], out)
    return Failure(rank, f"{how} (log: {_log(out, rank)}){also}; stopped the other ranks", how,
                   restartable(failed[rank], failure_kind(out, rank)))


def likely_hung(procs: list[subprocess.Popen], out: Path, alive: list[int]) -> int:
    """Among the ranks still alive when the others timed out: a stopped process, else the lowest last step
    in the heartbeats, else the lowest rank."""
    stopped = [r for r in alive if process_state(procs[r].pid) == "stopped"]
    if stopped:
        return stopped[0]
    beats = read_beats(out, len(procs))
    return min(alive, key=lambda r: (beats[r].step if r in beats else -2, r))


def _check_progress(procs: list[subprocess.Popen], out: Path, watch: Watch) -> Failure | None:
    """The watchdog: None while some rank finishes steps; else dump every rank's stack and name who stopped."""
    def dump() -> None:
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGUSR1)  # the rank alone: faulthandler writes its stack to its log
                except ProcessLookupError:
                    pass

    found = stall(out, len(procs), watch, dump)
    if found is None:
        return None
    beats, idle = found
    first = first_stopped(beats) or list(range(len(procs)))
    return _stalled(out, len(procs), beats, idle, {r: process_state(procs[r].pid) for r in first})


def stall(out: Path, ranks: int, watch: Watch, dump: Callable[[], None]) -> tuple[dict[int, Beat], float] | None:
    """(beats, seconds without progress) once the watchdog's limit has passed, after `dump` asked every rank
    for its stack; None while some rank progresses (beats are read every heartbeat.beat_interval)."""
    now = time.time()
    if now - watch.read_at < beat_interval(ranks):
        return None
    watch.read_at = now
    beats = read_beats(out, ranks)
    if beats != watch.seen:
        watch.seen, watch.changed = beats, now
        return None
    if not watch.due(now, ranks):
        return None
    dump()
    time.sleep(DUMP_WAIT_S)
    return beats, now - watch.changed


def _stalled(out: Path, ranks: int, beats: dict[int, Beat], idle: float, states: dict[int, str]) -> Failure:
    """The watchdog's verdict: the ranks at the lowest last step (with their process state where known)."""
    first = first_stopped(beats) or list(range(ranks))
    silent = [r for r in range(ranks) if r not in beats]
    where = ", ".join(f"rank {r} (last step {beats[r].step if r in beats else 'none'}"
                      + (f", process {states[r]})" if r in states else ")") for r in first[:8])
    where += ", ..." if len(first) > 8 else ""
    top = max((b.step for b in beats.values()), default=-1)
    rest = f"; the others reached step {top}" if top > min((b.step for b in beats.values()), default=top) else \
        ("; every rank is at the same step" if len(first) == ranks else "")
    if silent:
        rest += f"; rank(s) {', '.join(map(str, silent[:8]))} never wrote a heartbeat"
    how = f"rank {first[0]} stopped progressing" if len(first) < ranks else "every rank stopped progressing"
    text = (f"watchdog: no rank finished a step for {idle:.0f} s; stopped first: {where}{rest}; each rank's Python "
            f"stack is in its log ({_log(out, 0).parent}/rankNNNNN.log); stopped the job")
    return Failure(first[0], text, how, True, HUNG_GRACE_S)


def _failed(procs: list[subprocess.Popen], out: Path) -> dict[int, int]:
    """rank -> exit code of every rank that failed so far (0 = exited without its .done marker)."""
    failed = {}
    for rank, p in enumerate(procs):
        code = p.poll()
        if code is not None and (code != 0 or not _done(out, rank).exists()):
            failed[rank] = code
    return failed


def run_command(argv: list[str], env: dict[str, str], what: str, out: Path | None = None, ranks: int = 0,
                watch: Watch | None = None) -> None:
    """Run one launcher command (mpirun/srun) in its own session, forwarding SIGINT/SIGTERM; fail on non-zero.

    Its stderr passes through to ours, and its last lines are kept: mpirun and srun name the rank (and host)
    that ended the step there (``culprit``). With `watch` (and the ranks' OUT/logs on a shared folder) the
    watchdog reads the ranks' heartbeats; when it fires, SIGUSR1 to the launcher command (mpirun and srun pass
    it on to every rank: stacks into the logs), then the command is stopped and RanksFailed names the ranks
    that stopped first."""
    with _Signals() as sig:
        p = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True, preexec_fn=_term_with_parent)
        said, reader = _pass_through(p.stderr)
        try:
            while p.poll() is None:
                if sig.got is not None:
                    _signal_group(p, sig.got)
                    try:
                        p.wait(timeout=GRACE_S)
                    except subprocess.TimeoutExpired:
                        pass
                    raise RunFailed(f"interrupted by {signal.Signals(sig.got).name}: forwarded to {what}")
                if out is not None and ranks and (late := all_ended_for(out, ranks)) > ENDED_GRACE_S:
                    # every rank has left its last word, yet mpirun/srun waits: typically for the daemon of a
                    # node it can no longer reach (a partition); it would wait until the link comes back
                    stop_all([p], grace=GRACE_S)
                    raise RunFailed(f"all {ranks} ranks ended {late:.0f} s ago (see OUT/logs/) but {what} did not "
                                    f"exit (a node it cannot reach?); stopped it")
                if watch is not None and out is not None and (found := stall(out, ranks, watch,
                                                                              lambda: p.send_signal(signal.SIGUSR1))):
                    f = _stalled(out, ranks, *found, {})
                    stop_all([p], grace=f.grace)
                    raise RanksFailed(f.text, f.rank, found[0][f.rank].step if f.rank in found[0] else -1, True,
                                      True, f.how)
                time.sleep(POLL_S)
        finally:
            if p.poll() is None:
                _signal_group(p, signal.SIGKILL)
                p.wait()
    reader.join(timeout=5)  # the command's last lines
    if p.returncode != 0:
        raise CommandFailed(f"{what} {how_it_ended(p.returncode)}; see the ranks' lines above and OUT/logs/",
                            list(said))


def all_ended_for(out: Path, ranks: int) -> float:
    """Seconds since the last of `ranks` ranks left its .done or .failed marker; 0 while any has not (the
    first rank without one ends the scan, so a running job costs a file check or two per poll)."""
    stamps = []
    for rank in range(ranks):
        marks = [m for m in (_done(out, rank), _failed_marker(out, rank)) if m.exists()]
        try:
            stamps.append(max(m.stat().st_mtime for m in marks))
        except (OSError, ValueError):  # no marker yet, or one just removed
            return 0.0
    return max(0.0, time.time() - max(stamps))


def _term_with_parent() -> None:
    """In the launcher command's child before exec: SIGTERM when this launcher dies (even by SIGKILL); mpirun and
    srun then end their ranks. Linux only; elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class CommandFailed(RunFailed):
    """mpirun/srun ended non-zero; `lines` are the last lines it wrote to stderr."""

    def __init__(self, text: str, lines: list[str]):
        super().__init__(text)
        self.lines = lines


def _pass_through(stream, keep: int = 60):
    """Copy a command's stderr to ours line by line in a thread: (the last `keep` lines, the thread)."""
    import threading

    last: deque = deque(maxlen=keep)

    def copy() -> None:
        for raw in iter(stream.readline, b""):
            sys.stderr.write(raw.decode(errors="replace"))
            sys.stderr.flush()
            last.append(raw.decode(errors="replace").rstrip("\n"))
    reader = threading.Thread(target=copy, name="launcher-stderr", daemon=True)
    reader.start()
    return last, reader


# OpenMPI/PRRTE: "mpirun noticed that process rank 3 with PID 123 on node node2 exited on signal 9 (Killed)."
# Slurm: "srun: error: node2: task 3: Killed" (or "tasks 2-3").
_MPI_KILLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on\s+signal (\d+)")
_SRUN_ERROR = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+)")


def culprit(lines: list[str]) -> tuple[int, str, str] | None:
    """(rank, host, how) of the rank that mpirun or srun says ended the step, or None. srun lists every task
    that ended, often a survivor's exit code first: a task ended by a signal is preferred."""
    if m := _MPI_KILLED.search(" ".join(lines)):  # mpirun breaks this message over two lines
        return int(m.group(1)), m.group(2), how_it_ended(-int(m.group(3)))
    found = [m for ln in lines if (m := _SRUN_ERROR.search(ln))]
    if not found:
        return None
    m = next((m for m in found if "exit code" not in m.group(3).lower()), found[0])
    status = m.group(3).strip()
    return int(m.group(2)), m.group(1), "was killed by SIGKILL" if status == "Killed" else f"ended ({status})"


def command_failed(e: RunFailed, out: Path, ranks: int) -> RanksFailed:
    """An mpirun/srun step that failed, judged from the command's own last lines (which rank, on which host)
    and from what the ranks left in OUT/logs (a shared folder): whether a restart may help (no rank reported
    bad input or a failed check) and whether any rank finished a step."""
    text = str(e)
    if text.startswith("interrupted"):
        return RanksFailed(text)
    beats = read_beats(out, ranks)
    progressed = any(b.step >= 0 for b in beats.values())
    reported = [r for r in range(ranks) if _failed_marker(out, r).exists()]
    kinds = {failure_kind(out, r) for r in reported}
    # "stopped": mpirun/srun send SIGTERM to the other ranks once one failed, a symptom (a stop the user asked
    # for reaches this launcher first and is never restarted)
    ok = (kinds - {"stopped"}) <= set(RESTARTABLE)
    named = culprit(getattr(e, "lines", []))
    if named is not None:
        rank, host, how = named
        said = mark_comm_failure(out, rank) or failure_message(out, rank)
        how += f": {said}" if said else ""
        return RanksFailed(text, rank, beats[rank].step if rank in beats else -1, ok, progressed,
                           f"rank {rank} on {host} {how}")
    rank = min((r for r in reported if failure_kind(out, r) in RESTARTABLE), default=min(reported, default=0))
    step = beats[rank].step if rank in beats and reported else -1  # no rank said anything: no rank to name
    return RanksFailed(text, rank, step, ok, progressed, f"the {ranks}-rank step failed ({text.split(';')[0]})")


def echo_err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
