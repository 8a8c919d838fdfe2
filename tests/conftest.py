"""Marks: every test under tests/dist starts several processes (ranks, mpirun) and is marked `dist`, so that
`python -m pytest -m "not dist"` runs the single-process tests alone."""
from __future__ import annotations

from pathlib import Path

import pytest

DIST = Path(__file__).parent / "dist"


def pytest_collection_modifyitems(items):
    for item in items:
        if DIST in Path(item.fspath).parents:
            item.add_marker(pytest.mark.dist)
