"""Rank heartbeats and the launcher's view of them (no torch import).

Each rank rewrites OUT/logs/rankNNNNN.beat, a small JSON object ``{"rank", "pid", "step", "time"}``: the global
step it last finished and when. A rank records every step in memory (``Heartbeat.record``, called through
``StopRequest.on_step``: one assignment, no lock, no file) and a daemon thread writes the file at most once a
second (more rarely above 256 ranks: ``beat_interval``), so that a slow shared file system never stalls a step
and the file names the last finished step within that interval even when the rank then blocks.
The file is replaced atomically (write a temporary, rename), so the launcher never reads half a beat.

The local launcher reads the beats (``read_beats``) for its watchdog (who progressed last, who stopped first)
and for its restart messages (the step at which a rank failed).

When a rank is started by the local launcher it also dies with it (``die_with_parent``): the kernel sends it
SIGTERM when the launcher's process ends (prctl PR_SET_PDEATHSIG), which stops the ranks together with a
checkpoint, and a watch thread kills the rank's whole process group (its data-loader workers too) if it is
still there ``grace`` seconds after the launcher went away.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

WRITE_EVERY_S = 1.0
FILES_PER_S = 256
"""At most this many beat files written (and read) per second over the whole job, for a shared file system's
metadata server: 2,176 ranks write theirs every 8.5 s."""
PARENT_ENV = "TORUS_TRAIN_PARENT_PID"
"""Set by the local launcher to its own pid: the rank dies when that process ends."""
PR_SET_PDEATHSIG = 1


def beat_interval(ranks: int) -> float:
    """Seconds between two writes of one rank's beat, and between two reads of all beats by the launcher."""
    return max(WRITE_EVERY_S, ranks / FILES_PER_S)


def beat_path(out: Path, rank: int) -> Path:
    return Path(out) / "logs" / f"rank{rank:05d}.beat"


@dataclass(frozen=True)
class Beat:
    """One rank's last heartbeat as the launcher reads it."""

    rank: int
    pid: int
    step: int
    """Global step last finished; -1 before the first step."""
    time: float
    """time.time() when that step finished (or when the rank started)."""


class Heartbeat:
    """Writes one rank's beat file from its own thread; ``record`` (after every optimizer step) never touches it."""

    def __init__(self, out: Path, rank: int, every_s: float = WRITE_EVERY_S):
        self.path = beat_path(out, rank)
        self.rank, self.every_s = rank, every_s
        self._latest = (-1, time.time())
        """(step, time) of the last record: replaced whole by one assignment, read whole by the writer."""
        self._written: tuple[int, float] | None = None
        self._stop = threading.Event()
        self._fresh = threading.Event()
        """Set by record(): the writer wakes at once, so a rank that dies a second after its first steps has
        still left the step it reached."""
        self._write()  # the start-up beat, before any step
        self._thread = threading.Thread(target=self._flush_loop, name="heartbeat", daemon=True)
        self._thread.start()

    def record(self, step: int) -> None:
        """The training thread's part: remember the step (the writer thread puts it in the file)."""
        self._latest = (step, time.time())
        self._fresh.set()

    def close(self) -> None:
        """Write the last recorded step and stop the writer thread."""
        self._stop.set()
        self._fresh.set()
        self._thread.join(timeout=2 * self.every_s)
        self._write()

    def _flush_loop(self) -> None:
        """Write a new step as soon as it is recorded, then at most once per every_s."""
        while True:
            self._fresh.wait()
            if self._stop.is_set():
                return
            self._fresh.clear()
            self._write()
            if self._stop.wait(self.every_s):
                return

    def _write(self) -> None:
        latest = self._latest
        if self._written == latest:
            return
        step, t = latest
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"rank": self.rank, "pid": os.getpid(), "step": step, "time": t}))
            os.replace(tmp, self.path)
        except OSError:
            return  # a full disk must not kill the rank; the watchdog then sees no progress
        self._written = latest


def read_beats(out: Path, ranks: int) -> dict[int, Beat]:
    """rank -> its last beat, for the ranks whose beat file exists and parses."""
    beats = {}
    for rank in range(ranks):
        try:
            d = json.loads(beat_path(out, rank).read_text())
            beats[rank] = Beat(int(d["rank"]), int(d["pid"]), int(d["step"]), float(d["time"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return beats


def first_stopped(beats: dict[int, Beat]) -> list[int]:
    """The ranks that stopped progressing first: those at the lowest last step (all of them on a tie)."""
    if not beats:
        return []
    low = min(b.step for b in beats.values())
    return sorted(r for r, b in beats.items() if b.step == low)


def die_with_parent(environ=os.environ, grace: float = 20.0) -> None:
    """When launched by the local launcher (PARENT_ENV set): SIGTERM on the launcher's death, then SIGKILL to
    this rank's process group after `grace` seconds if it is still alive."""
    parent = environ.get(PARENT_ENV, "")
    if not parent.isdigit():
        return
    parent_pid = int(parent)
    try:
        kernel_signals = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0
    except (OSError, AttributeError):
        kernel_signals = False  # not Linux: the watch thread sends the SIGTERM itself

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        if not kernel_signals:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        try:
            os.killpg(os.getpgid(0), signal.SIGKILL)
        except OSError:
            os.kill(os.getpid(), signal.SIGKILL)

    if os.getppid() != parent_pid:  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
