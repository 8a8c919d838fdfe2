"""Where torus-train keeps what it makes once and reuses (pure, no torch): the demo set."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$TORUS_TRAIN_CACHE, or ~/.cache/torus-train."""
    base = os.environ.get("TORUS_TRAIN_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "torus-train"
