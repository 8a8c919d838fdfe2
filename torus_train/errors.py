"""Errors a user can cause, and how the CLI reports them (one line, no traceback)."""

from __future__ import annotations

import math
import os
from pathlib import Path


class UserError(ValueError):
    """Bad input: a flag, a spec field, a file. Reported as one line; exit code 2."""

    exit_code = 2


class RunFailed(RuntimeError):
    """The job started but failed (a dead rank, a diverged replica, a corrupt checkpoint). Exit code 1."""

    exit_code = 1


class PeerLost(RuntimeError):
    """A peer rank exited or stopped answering inside a collective: a crash of the job, not a verdict on it
    (--max-restarts restarts it, as it does a gloo or NCCL error for the same cause). Exit code 1."""

    exit_code = 1


def shown_path(path: object, limit: int = 80) -> str:
    """A user path for a one-line message, cut in the middle when very long."""
    text = str(path)
    return text if len(text) <= limit else f"{text[:40]}...{text[-30:]} ({len(text)} characters)"


def check_output_file(path: object, flag: str) -> None:
    """Before any work: a file the user asked to be written (--json, --plot) can be created, i.e. the name is
    usable, it is not a folder and its folder exists. UserError naming the flag otherwise."""
    text = str(path)
    if "\0" in text:
        raise UserError(f"{flag}: the file name contains a NUL character")
    p = Path(text)
    try:
        if p.is_dir():
            raise UserError(f"{flag} {shown_path(text)}: is a folder; give a file name")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            why = "is a file, not a folder" if parent.exists() else "does not exist"
            raise UserError(f"{flag} {shown_path(text)}: its folder {shown_path(parent)} {why}")
        if any(len(os.fsencode(part)) > 255 for part in p.parts):
            raise UserError(f"{flag} {shown_path(text)}: a name in the path is longer than 255 bytes")
    except OSError as e:
        raise UserError(f"{flag} {shown_path(text)}: {e.strerror or e}") from None


def check_output_folder(path: object, flag: str) -> None:
    """An output folder the user named can be made: no file sits at it or above it, and the names are usable."""
    text = str(path)
    if "\0" in text:
        raise UserError(f"{flag}: the folder name contains a NUL character")
    p = Path(text)
    try:
        if any(len(os.fsencode(part)) > 255 for part in p.parts):
            raise UserError(f"{flag} {shown_path(text)}: a name in the path is longer than 255 bytes")
        for q in (p, *p.parents):
            if q.is_symlink():
                q.stat()  # a symlink loop (ELOOP) is named here, not taken for a missing folder
            if q.exists():
                if not q.is_dir():
                    where = "" if q == p else f" ({shown_path(q)})"
                    raise UserError(f"{flag} {shown_path(text)}: a file is in the way{where}; give a folder")
                break
    except OSError as e:
        raise UserError(f"{flag} {shown_path(text)}: {e.strerror or e}") from None


def check_number(
    value: float | None, flag: str, low: float = 0.0, low_ok: bool = False, high: float | None = None
) -> None:
    """A float flag finite and in range (low exclusive unless low_ok); None (not given) passes."""
    if value is None:
        return
    if not math.isfinite(value):
        raise UserError(f"{flag}: {value:g} must be a finite number")
    if value < low or (value == low and not low_ok):
        raise UserError(f"{flag}: {value:g} must be {'>=' if low_ok else '>'} {low:g}")
    if high is not None and value > high:
        raise UserError(f"{flag}: {value:g} must be <= {high:g}")


# What gloo and NCCL write when a collective fails, and what it means for the user: (the wordings that say it,
# library, meaning), matched without regard to case. NCCL's watchdog may abort the process
# (TORCH_NCCL_ASYNC_ERROR_HANDLING=1) before Python runs, leaving only its log lines: the launcher then reads
# them from the rank's log (ranks/diagnosis.py).
COMM_FAILURES = (
    (("Timed out waiting",), "gloo", "a collective waited comm.timeout_s for a peer (a lost, hung or cut-off rank)"),
    (("Connection closed by peer",), "gloo", "a peer's connection closed in a collective (the peer died?)"),
    (
        ("Watchdog caught collective operation timeout", "Process group watchdog thread terminated"),
        "nccl",
        "an NCCL collective ran past comm.timeout_s and NCCL's watchdog aborted it (a lost, hung or cut-off rank)",
    ),
    (
        ("Some NCCL operations have failed or timed out",),
        "nccl",
        "NCCL took the rank down after a failed or timed-out collective (TORCH_NCCL_ASYNC_ERROR_HANDLING)",
    ),
    (("NCCL communicator was aborted",), "nccl", "the NCCL communicator was aborted (another rank failed first?)"),
    (
        ("Duplicate GPU detected",),
        "nccl",
        "two ranks on one GPU: NCCL runs one rank per GPU (start fewer ranks, or CPU ranks with --backend gloo)",
    ),
    (
        ("ncclRemoteError", "remote process exited or there was a network error"),
        "nccl",
        "NCCL remote error: a peer exited or the network between them failed",
    ),
    (
        ("ncclSystemError", "unhandled system error"),
        "nccl",
        "NCCL system error: a system call, the network or a device failed (NCCL_DEBUG=INFO names which)",
    ),
    (
        ("ncclUnhandledCudaError", "unhandled cuda error"),
        "nccl",
        "a CUDA call inside NCCL failed (a GPU error; NCCL_DEBUG=INFO and the rank's log say which)",
    ),
    (("ncclInternalError", "internal check failed"), "nccl", "NCCL internal error (NCCL_DEBUG=INFO for details)"),
)
COMM_FAILURES_GENERAL = (
    (("ncclInvalidUsage", "invalid usage"), "nccl", "NCCL refused how it was called (NCCL_DEBUG=WARN says why)"),
    (("NCCL error",), "nccl", "an NCCL call failed (NCCL_DEBUG=INFO for details)"),
)
"""Asked only when no line matched COMM_FAILURES: NCCL's first line ("NCCL error in: ..., invalid usage") is
general, and a later line ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device ...") says why."""


def comm_failure(text: str) -> str | None:
    """One line for the first failed-collective message of gloo or NCCL in ``text`` (an exception's text or a
    log's tail): what it means, then the library's own line; None when there is none."""
    lines = text.splitlines()
    for table in (COMM_FAILURES, COMM_FAILURES_GENERAL):
        for line in lines:
            low = line.lower()
            for wordings, _library, meaning in table:
                if any(words.lower() in low for words in wordings):
                    return f"{meaning}: {line.strip()[:300]}"
    return None
