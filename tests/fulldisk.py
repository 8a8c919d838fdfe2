"""A small file system of the test's own (tmpfs, mounted by root) and a writer that fills it to the last byte,
for the tests of a full output folder; skipped where the test cannot mount."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_fs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` for the block; unmounted (and everything on it gone) after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path) -> int:
    """Write `path` until the file system holds no more, in ever smaller pieces down to one byte; the bytes
    written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for piece in (1 << 20, 4096, 1):
            try:
                while True:
                    written += f.write(b"\0" * piece)
            except OSError:
                continue
    return written
