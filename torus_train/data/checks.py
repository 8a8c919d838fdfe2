"""Checking a data folder file by file (``torus-train data check``, ``bench input``): every file listed as
the index lists it, and every JPEG's first and last bytes are the JPEG markers (truncated or not a JPEG at
all is a DataError naming the file). Ranks never do this: they read the index (data/index.py)."""

from __future__ import annotations

import os
from pathlib import Path

from torus_train.data.index import IMAGE_EXTENSIONS, DataError, Split, list_split  # noqa: F401  (re-exported)

JPEG_EXTENSIONS = (".jpg", ".jpeg")


def jpeg_problem(head: bytes, tail: bytes, size: int) -> str | None:
    """Why a file with these first bytes, last (up to 64) bytes and size is not a whole JPEG; None if it is."""
    if size == 0:
        return "empty file"
    if head[:3] != b"\xff\xd8\xff":
        return "not a JPEG file (no start-of-image marker)"
    if b"\xff\xd9" not in tail.rstrip(b"\x00\r\n "):
        return "corrupt JPEG (truncated: no end-of-image marker)"
    return None


def check_jpeg(path: str) -> None:
    """Raise DataError unless ``path`` starts with the JPEG SOI marker and ends with EOI (allowing padding)."""
    try:
        with open(path, "rb") as f:
            head = f.read(3)
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64))
            tail = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror})") from None
    problem = jpeg_problem(head, tail, size)
    if problem:
        raise DataError(f"{path}: {problem}")


def is_jpeg_name(path: str) -> bool:
    return os.path.splitext(path)[1].lower() in JPEG_EXTENSIONS


def scan(data_root: str | os.PathLike, split: str, verify: bool = True) -> Split:
    """List ``data_root/split`` as the index does; ``verify`` also checks the JPEG markers of every file."""
    classes, names, labels = list_split(data_root, split)
    root = Path(data_root) / split
    files = [str(root / n) for n in names]
    for p in files:
        if not os.path.isfile(p):
            raise DataError(f"{p}: not an image file (a folder or a broken link)")
        if verify and os.path.splitext(p)[1].lower() in JPEG_EXTENSIONS:
            check_jpeg(p)
    return Split(root, classes, tuple(files), tuple(labels))


def verify_files(split: Split) -> None:
    """Every file of ``split`` exists and every JPEG has its markers; DataError naming the first that fails."""
    for p in split.files:
        if not os.path.isfile(p):
            raise DataError(
                f"{p}: missing (listed in the index); rebuild it with: torus-train data index "
                f"--data {split.root.parent}"
            )
        if os.path.splitext(p)[1].lower() in JPEG_EXTENSIONS:
            check_jpeg(p)
