"""Errors a user can cause, and how the CLI reports them (one line, no traceback)."""
from __future__ import annotations


class UserError(ValueError):
    """Bad input: a flag, a spec field, a file. Reported as one line; exit code 2."""

    exit_code = 2


class RunFailed(RuntimeError):
    """The job started but failed (a dead rank, a diverged replica, a corrupt checkpoint). Exit code 1."""

    exit_code = 1
