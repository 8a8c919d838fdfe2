"""What the ranks left behind and what it says: the root cause of a failure, and whether a restart may help.

Each rank leaves files in OUT/logs: ``rankNNNNN.log`` (its stderr), ``rankNNNNN.done`` on success,
``rankNNNNN.failed`` (the kind of a failure it recognised: input, stopped, verdict, crash: the restart policy's
input, which torch has no word for) and ``rankNNNNN.error.json`` (the uncaught exception with its traceback,
written by torch's ``record``) besides its heartbeat (ranks/heartbeat.py); an NCCL rank's flight recorder
dumps ``nccl_trace_rank_R`` there when a collective times out. From these, from the exit codes of local ranks
and from the last lines of an mpirun or srun command, a failure becomes one ``RanksFailed``: the rank that most
likely started it, the step it had finished, whether a restart from the latest checkpoint could help
(``restartable``) and whether any rank finished a step (``progressed``). No torch import.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from torus_train.errors import RunFailed, comm_failure
from torus_train.ranks.evidence import SAW_EXIT, Said, hung_rank, named_in
from torus_train.ranks.heartbeat import beat_path, read_beats
from torus_train.train.checkpoint import list_checkpoints

TRACEBACK_LINES = 40
"""The last lines of a recorded traceback the launcher prints (the whole one is in the rank's .error.json)."""
GRACE_S = 10.0
"""Seconds the ranks get to stop after SIGTERM before SIGKILL."""
NO_SPACE_KIND = "no space"
"""A rank's failure kind when its output's file system was full (never restarted: the next attempt fills it too)."""
RESTARTABLE = ("crash",)
"""Kinds of a rank's own failure (its .failed marker) that a restart may cure; input errors, a stop asked for
by a signal and the job's own verdicts (diverged replicas, non-finite loss, a bad checkpoint) would repeat."""


class RanksFailed(RunFailed):
    """The ranks failed after launch. `rank` is the root cause, `step` the last step it finished (-1: none),
    `restartable` whether starting again from the latest checkpoint could help, `progressed` whether any rank
    finished a step in this attempt."""

    def __init__(
        self,
        text: str,
        rank: int = -1,
        step: int = -1,
        restartable: bool = False,
        progressed: bool = False,
        how: str = "",
    ):
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


# --------------------------------------------------------------------------------------------------------
# The files a rank leaves in OUT/logs
# --------------------------------------------------------------------------------------------------------
def log_path(out: Path, rank: int) -> Path:
    return out / "logs" / f"rank{rank:05d}.log"


def done_path(out: Path, rank: int) -> Path:
    return out / "logs" / f"rank{rank:05d}.done"


def failed_path(out: Path, rank: int) -> Path:
    return out / "logs" / f"rank{rank:05d}.failed"


def reserve_path(out: Path, rank: int) -> Path:
    """The room a rank takes for its .failed marker when it starts (a full disk cannot then keep it empty)."""
    return out / "logs" / f"rank{rank:05d}.failed.room"


def error_path(out: Path, rank: int) -> Path:
    """Where torch's ``record`` writes the rank's uncaught exception (TORCHELASTIC_ERROR_FILE, set by the worker)."""
    return out / "logs" / f"rank{rank:05d}.error.json"


TRACE_PREFIX = "nccl_trace_rank_"
"""NCCL's flight recorder dumps OUT/logs/nccl_trace_rank_R (TORCH_FR_DUMP_TEMP_FILE, set by the worker), the
prefix `torchfrtrace OUT/logs -p nccl_trace_rank_` reads."""


def trace_path(out: Path, rank: int) -> Path:
    return out / "logs" / f"{TRACE_PREFIX}{rank}"


def reset_rank_files(out: Path, ranks: Iterable[int]) -> None:
    """Before an attempt: no .done, .failed, .error.json, .beat or flight-recorder file of an earlier one may
    speak for this one (the launcher clears every rank's; under torchrun's restarts each rank its own)."""
    for rank in ranks:
        for path in (done_path, failed_path, reserve_path, error_path, trace_path, beat_path):
            path(out, rank).unlink(missing_ok=True)


def tail(path: Path, lines: int = 8) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return [ln.rstrip("\n") for ln in deque(f, maxlen=lines)]
    except OSError:
        return []


def recorded_traceback(out: Path, rank: int) -> list[str]:
    """The traceback torch's ``record`` wrote for the rank's uncaught exception ({"message": {"message",
    "extraInfo": {"py_callstack", "timestamp"}}}); [] when it wrote none (a signal, NCCL's abort)."""
    try:
        d = json.loads(error_path(out, rank).read_text())
        return str(d["message"]["extraInfo"]["py_callstack"]).rstrip("\n").splitlines()
    except (OSError, ValueError, KeyError, TypeError):
        return []


def failure_kind(out: Path, rank: int) -> str:
    """The kind a rank gave its own failure (input, stopped, verdict, crash), or '' if it said nothing."""
    try:
        return str(json.loads(failed_path(out, rank).read_text()).get("kind", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def mark_comm_failure(out: Path, rank: int, lines: int = 400) -> str:
    """A rank that died without its .failed marker (NCCL's watchdog aborts the process before Python runs) but
    whose log tail holds gloo's or NCCL's words for a failed collective: the marker is written for it (kind
    crash, restartable) and its one line returned; '' otherwise. The tail is long: faulthandler (torch's
    ``record``) prints every thread's stack after NCCL's words when the abort's SIGABRT arrives."""
    if failed_path(out, rank).exists():
        return ""
    said = comm_failure("\n".join(tail(log_path(out, rank), lines)))
    if said is None:
        return ""
    try:
        failed_path(out, rank).write_text(
            json.dumps({"rank": rank, "kind": "crash", "message": said, "written_by": "launcher, from the log"})
        )
    except OSError:
        pass
    return said


def out_of_space(out: Path, ranks: int) -> tuple[int, str] | None:
    """(rank, its line) of the first rank whose output's file system was full, else None: that is the cause
    whatever else failed with it (the others time out or get the same broadcast failure)."""
    for rank in range(ranks):
        if failed_path(out, rank).exists() and failure_kind(out, rank) == NO_SPACE_KIND:
            return rank, failure_message(out, rank)
    return None


def rank_failure(e: BaseException, rank: int) -> RunFailed | None:
    """A rank's exception that is gloo's or NCCL's word for a failed collective (errors.COMM_FAILURES: a lost
    peer, a timeout, "Duplicate GPU detected", an unhandled system or CUDA error) as one line naming the rank;
    None for anything else (a bug keeps its traceback). For ranks without a job folder (bench)."""
    said = comm_failure(str(e))
    return RunFailed(f"rank {rank} failed: {said}") if said else None


def failure_message(out: Path, rank: int) -> str:
    """The one line a rank gave a failure it recognised (input, verdict, stopped, no space); '' for a crash or
    none."""
    try:
        d = json.loads(failed_path(out, rank).read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(d, dict) or d.get("kind") not in ("input", "verdict", "stopped", NO_SPACE_KIND):
        return ""
    return str(d.get("message", "")).splitlines()[0] if d.get("message") else ""


# --------------------------------------------------------------------------------------------------------
# Local ranks: exit codes, logs and process states
# --------------------------------------------------------------------------------------------------------
def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def restartable(code: int, kind: str) -> bool:
    """A rank killed by a signal, exited 0 too early, or crashed (or died without saying why): a restart may
    cure it. Bad input, a requested stop and the job's own verdicts would fail again the same way."""
    if code < 0 or code == 0 or not kind:
        return True
    return kind in RESTARTABLE


# Log lines of a rank that failed only because a peer went away: not the root cause.
PEER_LOST = (
    "connection closed",
    "connection reset",
    "connection refused",
    "broken pipe",
    "timed out",
    "timeout",
    "peer",
    "exited during",
    "died",
    "lost",
)


def root_cause(failed: dict[int, int], out: Path) -> int:
    """Among ranks that ended badly at about the same time, the one that most likely started it:
    killed by a signal first, then one whose log shows no lost-peer error, then the lowest rank."""

    def score(rank: int) -> tuple[int, int]:
        code = failed[rank]
        if code < 0:
            return 0, rank
        text = " ".join(tail(log_path(out, rank), 30)).lower()
        return (2 if any(k in text for k in PEER_LOST) else 1), rank

    return min(failed, key=score)


def peer_lost(rank: int, out: Path) -> bool:
    """True when a rank's log ends with a lost-peer or timeout error (a symptom, not a cause)."""
    text = " ".join(tail(log_path(out, rank), 30)).lower()
    return any(k in text for k in PEER_LOST)


def process_state(pid: int) -> str:
    """'stopped', 'running', 'sleeping', ... from /proc (Linux), else 'still alive'."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "still alive"
    return {
        "T": "stopped",
        "t": "stopped",
        "R": "running",
        "S": "sleeping",
        "D": "in uninterruptible wait",
        "Z": "exited",
    }.get(state, f"state {state}")


def describe(rank: int, code: int) -> str:
    if code == 0:
        return f"rank {rank} exited with code 0 before finishing"
    return f"rank {rank} {how_it_ended(code)}"


def failed_ranks(procs: list[subprocess.Popen], out: Path) -> dict[int, int]:
    """rank -> exit code of every rank that failed so far (0 = exited without its .done marker)."""
    failed = {}
    for rank, p in enumerate(procs):
        code = p.poll()
        if code is not None and (code != 0 or not done_path(out, rank).exists()):
            failed[rank] = code
    return failed


def diagnose(procs: list[subprocess.Popen], out: Path, failed: dict[int, int]) -> Failure:
    rank = root_cause(failed, out)
    alive = [r for r, p in enumerate(procs) if p.poll() is None]
    if alive and all(peer_lost(r, out) for r in failed):
        # Everyone that failed was waiting for a peer; the peer that neither failed nor progressed is
        # the one that hung (e.g. stopped, or stuck outside any collective).
        hung = likely_hung(procs, out, alive)
        state = process_state(procs[hung].pid)
        how = f"rank {hung} stopped responding (process {state})"
        return Failure(
            hung,
            f"{how} on {socket.gethostname()}; rank(s) {', '.join(map(str, sorted(failed)))} timed out or lost the "
            f"connection waiting for it (log: {log_path(out, hung)}); stopped the other ranks",
            how,
            True,
        )
    others = sorted(set(failed) - {rank})
    also = f"; then rank(s) {', '.join(map(str, others))} failed too" if others else ""
    how = describe(rank, failed[rank])
    return Failure(
        rank,
        f"{how} (log: {log_path(out, rank)}){also}; stopped the other ranks",
        how,
        restartable(failed[rank], failure_kind(out, rank)),
    )


def likely_hung(procs: list[subprocess.Popen], out: Path, alive: list[int]) -> int:
    """Among the ranks still alive when the others timed out: a stopped process, else the lowest last step
    in the heartbeats, else the lowest rank."""
    stopped = [r for r in alive if process_state(procs[r].pid) == "stopped"]
    if stopped:
        return stopped[0]
    beats = read_beats(out, len(procs))
    return min(alive, key=lambda r: (beats[r].step if r in beats else -2, r))


def ranks_failed(failure: Failure, out: Path, ranks: int, say: Callable[[str], None]) -> RanksFailed:
    """The error for a failure of local ranks, after saying the rank's own line, its traceback or the tail of
    its log, and where NCCL's flight recorder dumped the ranks' last collectives."""
    # a rank that named its own failure (bad input, a failed check, a stop) gets that one line; the traceback
    # (or the log's tail) is for crashes and deaths
    told = failure_message(out, failure.rank) if failure.rank >= 0 else ""
    if not told and failure.rank >= 0:
        told = mark_comm_failure(out, failure.rank)
    if told:
        say(f"torus-train: rank {failure.rank} failed: {told}")
    elif failure.rank >= 0:
        show_traceback(out, failure.rank, say)
    traces = [r for r in range(ranks) if trace_path(out, r).exists()]
    if traces:
        say(
            f"NCCL's flight recorder dumped the last collectives of rank(s) {', '.join(map(str, traces[:8]))}: "
            f"torchfrtrace {out / 'logs'} -p {TRACE_PREFIX}"
        )
    beats = read_beats(out, ranks)
    progressed = any(b.step >= 0 for b in beats.values())
    full = out_of_space(out, ranks)
    if full:
        return full_disk(full, out, beats, progressed)
    step = beats[failure.rank].step if failure.rank in beats else -1
    return RanksFailed(failure.text, failure.rank, step, failure.restartable, progressed, failure.how)


def full_disk(full: tuple[int, str], out: Path, beats: dict, progressed: bool) -> RanksFailed:
    """The failure of a job whose output folder's file system filled up: the rank's own line, never restarted."""
    rank, said = full
    kept = list_checkpoints(out / "checkpoints")
    if "checkpoint" not in said:  # a failed save says itself which one is kept
        said += f"; the checkpoint at step {kept[0][0]} is kept" if kept else "; no checkpoint was written yet"
    how = f"rank {rank} failed: {said}"
    return RanksFailed(how, rank, beats[rank].step if rank in beats else -1, False, progressed, how)


def show_traceback(out: Path, rank: int, say: Callable[[str], None], lines: int = TRACEBACK_LINES) -> None:
    """The first failing rank's traceback, as torch's ``record`` wrote it, else the last lines of its log (a
    rank killed by a signal or by NCCL's abort writes none)."""
    recorded = recorded_traceback(out, rank)
    if recorded:
        say(f"traceback in {error_path(out, rank)}:")
    shown = recorded[-lines:] or tail(log_path(out, rank))
    if shown and not recorded:
        say(f"last lines of {log_path(out, rank)}:")
    for ln in shown:
        say(f"  {ln}")


# --------------------------------------------------------------------------------------------------------
# An mpirun or srun step: the command's last lines and OUT/logs
# --------------------------------------------------------------------------------------------------------
def markers(out: Path, ranks: int) -> list[Said]:
    """Every rank's marker, oldest first (one launcher-side read per rank that wrote one)."""
    said = []
    for rank in range(ranks):
        path = failed_path(out, rank)
        try:
            d = json.loads(path.read_text())
            at = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if isinstance(d, dict):
            stalled = d.get("stalled_s", 0)
            said.append(
                Said(rank, at, str(d.get("message", "")), float(stalled) if isinstance(stalled, (int, float)) else 0.0)
            )
    return sorted(said, key=lambda s: (s.at, s.rank))


def accused(out: Path, ranks: int) -> tuple[int, list[int]] | None:
    """The hung rank and its waiters, from the ranks' markers in OUT/logs (hung_rank)."""
    found = hung_rank(markers(out, ranks), ranks)
    return found[:2] if found else None


def named_by_peers(
    evidence: str,
    out: Path,
    ranks: int,
    text: str,
    host_of: Callable[[int], str],
    beats: dict,
    ok: bool,
    progressed: bool,
) -> RanksFailed | None:
    """The failure as the ranks' own lines tell it, under mpirun and srun as under the local launcher: the rank
    the others waited for ("hung") or saw exit ("exited"), and its host."""
    said = markers(out, ranks)
    if evidence == "hung":
        found = hung_rank(said, ranks)
        did, saw = "stopped responding", "timed out waiting for it"
    else:
        exited = named_in(said, SAW_EXIT)
        found = (*exited, "") if exited else None
        did, saw = "exited in a collective", "saw it exit"
    if found is None:
        return None
    rank, by, itself = found
    host = host_of(rank)
    how = f"rank {rank}{f' on {host}' if host else ''} {did}"
    waited = f"rank(s) {', '.join(map(str, by[:8]))} {saw}" if by else "no other rank said why"
    line = f"{how}{itself}: {waited} (log: {log_path(out, rank)}); {text}"
    return RanksFailed(line, rank, beats[rank].step if rank in beats else -1, ok, progressed, how)


def command_failed(
    e: RunFailed, out: Path, ranks: int, launcher, host_of: Callable[[int], str] = lambda rank: ""
) -> RanksFailed:
    """An mpirun/srun step that failed, judged from the command's own last lines (the launcher entry's
    `culprit`: which rank, on which host) and the ranks' own lines (the rank they waited for or saw exit, on
    the host host_of gives; a hang first: srun names the stopped rank it killed at the end as killed), and from
    what the ranks left in OUT/logs (a shared folder): whether a restart may help
    (no rank reported bad input or a failed check) and whether any rank finished a step."""
    text = str(e)
    if text.startswith("interrupted"):
        return RanksFailed(text)
    beats = read_beats(out, ranks)
    progressed = any(b.step >= 0 for b in beats.values())
    full = out_of_space(out, ranks)
    if full:
        return full_disk(full, out, beats, progressed)
    reported = [r for r in range(ranks) if failed_path(out, r).exists()]
    kinds = {failure_kind(out, r) for r in reported}
    # "stopped": mpirun/srun send SIGTERM to the other ranks once one failed, a symptom (a stop the user asked
    # for reaches this launcher first and is never restarted)
    ok = (kinds - {"stopped"}) <= set(RESTARTABLE)
    told = (out, ranks, text, host_of, beats, ok, progressed)
    hung = named_by_peers("hung", *told)  # before the launcher's word: it names the rank it killed at the end
    if hung is not None:
        return hung
    named = launcher.culprit(getattr(e, "lines", []))
    if named is not None:
        rank, host, how = named
        said = mark_comm_failure(out, rank) or failure_message(out, rank)
        how += f": {said}" if said else ""
        return RanksFailed(
            text, rank, beats[rank].step if rank in beats else -1, ok, progressed, f"rank {rank} on {host} {how}"
        )
    exited = named_by_peers("exited", *told)
    if exited is not None:
        return exited
    rank = min((r for r in reported if failure_kind(out, r) in RESTARTABLE), default=min(reported, default=0))
    step = beats[rank].step if rank in beats and reported else -1  # no rank said anything: no rank to name
    return RanksFailed(text, rank, step, ok, progressed, f"the {ranks}-rank step failed ({text.split(';')[0]})")
