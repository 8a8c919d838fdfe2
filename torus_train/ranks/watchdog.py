"""The launcher's watchdog: a job in which no rank finishes a step for too long is ended (no torch import).

Every rank rewrites a heartbeat file with the last step it finished (ranks/heartbeat.py). When no rank has
finished a step for ``watchdog_s`` seconds (before every rank's first step: at least the start-up limit, the
collective timeout plus a margin), the launcher has each rank dump the Python stack of all its threads into
its log (SIGUSR1, faulthandler), names the ranks that stopped progressing first (the lowest last step) and
ends the job (docs/faults.md, "The heartbeat and the watchdog").
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torus_train.job.spec import JobSpec
from torus_train.ranks.diagnosis import Failure, log_path, process_state
from torus_train.ranks.heartbeat import Beat, beat_interval, first_stopped, read_beats

WATCHDOG_MARGIN_S = 60.0
"""Added to comm.timeout_s for the watchdog's default limit: the ranks' own timeout should fire first."""
HUNG_GRACE_S = 2.0
"""After the watchdog's verdict the ranks are stuck: no clean stop with a checkpoint is to be had."""
DUMP_WAIT_S = 2.0
"""How long the ranks get to write their stacks after SIGUSR1."""


def watchdog_limits(spec: JobSpec) -> tuple[float, float]:
    """(limit once every rank has finished a step, limit before that) in seconds. Before the first step a
    node-local copy (data.stage = node) may take up to data.stage_timeout_s on top: its own limit fires first."""
    limit = spec.comm.timeout_s + WATCHDOG_MARGIN_S
    staging = spec.data.stage_timeout_s if spec.data.stage == "node" else 0.0
    return spec.launch.watchdog_s or limit, limit + staging


def new_watch(watchdog_s: float, startup_s: float) -> Watch | None:
    return Watch(watchdog_s, startup_s, {}, time.time()) if watchdog_s > 0 else None


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


def check_progress(procs: list[subprocess.Popen], out: Path, watch: Watch) -> Failure | None:
    """The watchdog over local ranks: None while some rank finishes steps; else dump every rank's stack and
    name who stopped."""

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
    return stalled(out, len(procs), beats, idle, {r: process_state(procs[r].pid) for r in first})


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


def stalled(out: Path, ranks: int, beats: dict[int, Beat], idle: float, states: dict[int, str]) -> Failure:
    """The watchdog's verdict: the ranks at the lowest last step (with their process state where known)."""
    first = first_stopped(beats) or list(range(ranks))
    silent = [r for r in range(ranks) if r not in beats]
    where = ", ".join(
        f"rank {r} (last step {beats[r].step if r in beats else 'none'}"
        + (f", process {states[r]})" if r in states else ")")
        for r in first[:8]
    )
    where += ", ..." if len(first) > 8 else ""
    top = max((b.step for b in beats.values()), default=-1)
    rest = (
        f"; the others reached step {top}"
        if top > min((b.step for b in beats.values()), default=top)
        else ("; every rank is at the same step" if len(first) == ranks else "")
    )
    if silent:
        rest += f"; rank(s) {', '.join(map(str, silent[:8]))} never wrote a heartbeat"
    how = f"rank {first[0]} stopped progressing" if len(first) < ranks else "every rank stopped progressing"
    text = (
        f"watchdog: no rank finished a step for {idle:.0f} s; stopped first: {where}{rest}; each rank's Python "
        f"stack is in its log ({log_path(out, 0).parent}/rankNNNNN.log); stopped the job"
    )
    return Failure(first[0], text, how, True, HUNG_GRACE_S)
