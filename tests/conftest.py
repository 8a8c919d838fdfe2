"""Marks: every test under tests/dist starts several processes (ranks, mpirun) and is marked `dist`, so that
`python -m pytest -m "not dist"` runs the single-process tests alone. Tests marked `slow` (each over ~20 s
of multi-process training: the restart demo, resume against a straight run, ...) are skipped unless
TORUS_TRAIN_SLOW_TESTS=1, which keeps the default suite near 15 minutes on 2 cores."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

DIST = Path(__file__).parent / "dist"


def pytest_collection_modifyitems(items):
    slow = pytest.mark.skip(reason="slow: set TORUS_TRAIN_SLOW_TESTS=1 to run it")
    run_slow = os.environ.get("TORUS_TRAIN_SLOW_TESTS") == "1"
    for item in items:
        if DIST in Path(item.fspath).parents:
            item.add_marker(pytest.mark.dist)
        if not run_slow and item.get_closest_marker("slow"):
            item.add_marker(slow)
