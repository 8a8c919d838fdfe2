"""Where data.stage = node copies a packed set on each node: data.stage_dir, or the scheduler's node-local folder,
checked by the launcher before any rank starts (torus_train.data.stage does the copying). No torch, no numpy."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from torus_train.errors import UserError, shown_path

ENV_DIRS = ("SLURM_TMPDIR", "PBS_JOBFS", "SGE_LOCALDIR", "TMPDIR")


def stage_base(stage_dir: str, environ: Mapping[str, str] | None = None) -> Path:
    """The node-local folder: data.stage_dir, or the first scheduler/tmp variable set; UserError if none."""
    environ = os.environ if environ is None else environ
    if stage_dir:
        return Path(stage_dir)
    for name in ENV_DIRS:
        if environ.get(name):
            return Path(environ[name])
    raise UserError(
        "data.stage = node: no node-local folder; set data.stage_dir, or run where one of "
        f"${', $'.join(ENV_DIRS)} is set"
    )


def check_stage_base(stage_dir: str, environ: Mapping[str, str] | None = None) -> Path:
    """The launcher's check before any rank starts (a rank would find the same fault only after the launch):
    a node-local folder is named, and it is a folder, or can be made, where this process may write. Checked
    on the launcher's node; every node's own folder is checked again by its local rank 0."""
    environ = os.environ if environ is None else environ
    base = stage_base(stage_dir, environ)
    var = next((f"${n}" for n in ENV_DIRS if environ.get(n)), "")
    where = f"data.stage_dir {shown_path(base)}" if stage_dir else f"data.stage = node: {var} {shown_path(base)}"
    try:
        existing = next((q for q in (base, *base.parents) if q.exists()), None)
        is_dir = existing is None or existing.is_dir()
    except (OSError, ValueError) as e:
        raise UserError(f"{where}: {getattr(e, 'strerror', None) or e}") from None
    if not is_dir:
        what = "is a file" if existing == base else f"lies under the file {shown_path(existing)}"
        raise UserError(f"{where} {what}, not a folder; set data.stage_dir to a node-local folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(
            f"{where}: {shown_path(existing)} is not writable here; set data.stage_dir to a "
            f"node-local folder you can write"
        )
    return base
