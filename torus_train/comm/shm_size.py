"""The size of a shared-memory row's pieces (comm/shm.py), read from TORUS_TRAIN_SHM_PIECE_MB through the number
door: pure, so that `run`'s preflight refuses a bad value before any rank starts (no torch import)."""

from __future__ import annotations

from collections.abc import Mapping

from torus_train.usernumbers import env_float

PIECE_VARIABLE = "TORUS_TRAIN_SHM_PIECE_MB"
"""MB per slot of a row segment; unset: up to 8 MiB, at most about 256 MiB per row (comm/groups.py)."""
MAX_PIECE_MB = 1024.0
"""A slot of 1 GiB: three sets of them per peer of a row already fill a node's /dev/shm."""


def piece_bytes(environ: Mapping[str, str]) -> int | None:
    """Bytes per slot that PIECE_VARIABLE asks for (a multiple of 64, at least 64); None when it is unset."""
    mb = env_float(environ, PIECE_VARIABLE, 0.0, MAX_PIECE_MB, low_open=True)
    return None if mb is None else max(64, int(mb * (1 << 20)) // 64 * 64)
