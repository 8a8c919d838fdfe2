"""One run per output folder: the launching process claims OUT for the run's life (no torch import).

Two runs writing into one OUT mix their job.json, metrics and checkpoints and can end green with the other's
result. The claim is OUT/run.lock, held with an exclusive ``flock`` by the process that launches the ranks
(`torus-train run`, or rank 0 of a job started by mpirun/srun/torchrun by hand) until it exits; the file names
the holder (host, pid, start time) so that a second run is refused in one line naming them, before it launches
anything. ``flock`` is released by the kernel when the holder dies however it dies (SIGKILL included), so a
crashed run never leaves a claim behind; the file it leaves is only a note that the next run overwrites.

On a shared file system the lock is only as good as its locking: NFS (v3 with lockd, v4) forwards ``flock`` to
the server as a whole-file lock, seen by every client, and the server drops a dead client's locks when its lease
ends (about 90 s); Lustre does so when mounted with ``-o flock``. A mount whose locks stay on one node (NFS
``nolock``, Lustre ``localflock``) or that has none (Lustre's default refuses ``flock``) is covered by the note
itself: the holder rewrites its time every REFRESH_S, and a note from another host refreshed within STALE_S is
a claim (a run on another node); a note on this host is a claim while its pid lives. A note whose holder is
gone goes stale within STALE_S: nothing is stale for ever. docs/run.md ("One run per folder") says so to users.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from torus_train.errors import UserError, shown_path

CLAIM_FILE = "run.lock"
"""The claim's file in OUT (listed in rundir.RUN_ENTRIES: a run's own entry)."""
REFRESH_S = 60.0
"""How often the holder rewrites its note's time (read where the file system's locks are node-local or absent)."""
STALE_S = 300.0
"""A note from another host not refreshed for this long names a run that is gone."""
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
"""flock's answers on a file system without locks (Lustre mounted without -o flock, NFS without lockd)."""


@dataclass
class Claim:
    """OUT claimed by this process: the open, locked claim file and the thread that keeps its note fresh."""

    out: Path
    fd: int
    made: tuple[Path, ...]
    """The folders this claim made, OUT first and then its parents that did not exist (those that stayed empty
    are removed again on release: a refused run leaves no `runs/` behind)."""
    note: dict = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """Remove the claim file while still holding the lock (a run waiting on the old file sees it gone and
        tries again), then unlock; the folders this claim made and that stayed empty go too."""
        self.stop.set()
        try:
            os.unlink(self.out / CLAIM_FILE)
        except OSError:
            pass
        os.close(self.fd)
        for folder in self.made:
            try:
                folder.rmdir()
            except OSError:  # the run wrote into it (and so into its parents)
                break


JOB_IDS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMIX_NAMESPACE", "PBS_JOBID")
"""What names the job of ranks started by torchrun, srun, mpirun or PBS, all that are set (torchrun's run id
is "none" unless --rdzv-id or --standalone sets one): a restarted attempt's rank 0, on any node, takes over the
note its own job's earlier attempt left rather than waiting STALE_S for it."""


def job_of(environ) -> str:
    return " ".join(f"{k}={environ[k]}" for k in JOB_IDS if environ.get(k))


def holder_note(job: str = "") -> dict:
    note = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    return {**note, "job": job} if job else note


def claim_out(out: Path, flag: str = "--out", job: str = "") -> Claim:
    """Claim OUT for this process's run, or refuse in one line naming the folder and the run that holds it.
    job: the launcher's job id when this process is rank 0 of a job started by hand (job_of)."""
    made = tuple(p for p in (out, *out.parents) if not p.exists())
    try:
        out.mkdir(parents=True, exist_ok=True)
        while True:  # until the locked file is the one at the path (a releasing holder unlinks it)
            fd = _open_claim_file(out / CLAIM_FILE, flag)
            held = _lock(fd)
            if _still_linked(fd, out / CLAIM_FILE):
                break
            os.close(fd)
    except OSError as e:
        raise UserError(f"{flag} {shown_path(out)}: cannot claim the folder for this run: {e.strerror or e}") from None
    other = _read_note(fd)
    if held is False and not other:  # the holder locked a moment ago and is writing its note
        time.sleep(0.5)
        other = _read_note(fd)
    if job and other.get("job") == job:  # an earlier attempt of this same job left it
        other = {}
    if held is False or (held is None and _note_is_live(other)) or _held_elsewhere(other):
        os.close(fd)
        raise UserError(f"{flag} {shown_path(out)}: {held_by(other)}; wait for it to end or give another --out")
    claim = Claim(out, fd, made, holder_note(job))
    _write_note(claim)
    threading.Thread(target=_refresh, args=(claim,), name="out-claim", daemon=True).start()
    return claim


def held_by(note: dict) -> str:
    if not note:
        return "another run is using this folder"
    return (
        f"in use by the run started {note.get('started', '?')} on {note.get('host', '?')} (pid {note.get('pid', '?')})"
    )


def _open_claim_file(path: Path, flag: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted there is no claim of ours
        os.close(fd)
        raise UserError(f"{flag} {shown_path(path)}: not a regular file; remove it")
    return fd


def _lock(fd: int) -> bool | None:
    """True: locked; False: another process holds it; None: this file system has no locks (the note decides)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in NO_LOCKS:
            return None
        raise


def _still_linked(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _read_note(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0)
        note = json.loads(raw.decode("utf-8", "replace")) if raw.strip() else None
        if isinstance(note, dict) and note:
            note["refreshed"] = os.fstat(fd).st_mtime
            return note
    except (OSError, ValueError):
        pass
    return {}


def _write_note(claim: Claim) -> None:
    data = json.dumps(claim.note).encode() + b"\n"
    os.ftruncate(claim.fd, 0)
    os.pwrite(claim.fd, data, 0)


def _refresh(claim: Claim) -> None:
    """Rewrite the note's time while the run lives (read only where locks are node-local or absent)."""
    while not claim.stop.wait(REFRESH_S):
        try:
            os.utime(claim.fd)
        except OSError:
            pass


def _note_is_live(note: dict) -> bool:
    """A note of a run on this host whose pid still lives, or of another host refreshed within STALE_S."""
    if not note:
        return False
    if note.get("host") != socket.gethostname():
        refreshed = note.get("refreshed")  # a damaged note (no number here) holds nothing
        if not isinstance(refreshed, (int, float)) or isinstance(refreshed, bool):
            return False
        return time.time() - refreshed < STALE_S
    pid = note.get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _held_elsewhere(note: dict) -> bool:
    """The lock was ours, yet a fresh note from another host says a run there holds the folder: locks on this
    mount are node-local (NFS nolock, Lustre localflock)."""
    return bool(note) and note.get("host") != socket.gethostname() and _note_is_live(note)
