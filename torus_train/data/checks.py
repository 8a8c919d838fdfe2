"""Data-folder validation and the sharding rule shared by every loader (pure; no torch import).

A data folder holds ``train/CLASS/*`` and ``val/CLASS/*`` image files (ImageNet layout). ``scan`` lists one
split, sorted, with labels from the sorted class-folder names (the order ImageFolder and DALI's file reader
use), and raises ``DataError`` naming the path for a missing folder, an empty class folder, a file that is not
an image, or a JPEG whose first or last bytes are not the JPEG markers (truncated or not a JPEG at all).
Hidden files (names starting with ".") are ignored.

``shard`` is the one sharding rule: the sample order is a permutation of the whole data set (seeded by
``seed`` and the epoch, the same on every rank), padded by wrapping around to a multiple of
``world_size * batch_size``, then cut into ``world_size`` contiguous equal shards; rank r takes shard r (the
GLOBAL rank). Every rank therefore takes the same number of steps and, over one epoch, every sample is read
exactly once across the ranks, except the ``pad`` wrapped-around samples at the end of the last shards.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from torus_train.errors import UserError
from torus_train.train.schedule import steps_per_epoch

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
JPEG_EXTENSIONS = (".jpg", ".jpeg")


class DataError(UserError):
    """A data folder or file that cannot be read as a data set; the message names the path."""


@dataclass(frozen=True)
class Split:
    """One split of an ImageNet-layout folder, listed and checked."""

    root: Path
    """The split folder, e.g. DATA/train."""
    classes: tuple[str, ...]
    """Class-folder names in sorted order; label i is classes[i]."""
    files: tuple[str, ...]
    """Image paths, sorted by class then name."""
    labels: tuple[int, ...]
    """Label of each file."""

    def __len__(self) -> int:
        return len(self.files)


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
    if size == 0:
        raise DataError(f"{path}: empty file")
    if head[:3] != b"\xff\xd8\xff":
        raise DataError(f"{path}: not a JPEG file (no start-of-image marker)")
    if b"\xff\xd9" not in tail.rstrip(b"\x00\r\n "):
        raise DataError(f"{path}: corrupt JPEG (truncated: no end-of-image marker)")


def scan(data_root: str | os.PathLike, split: str, verify: bool = True) -> Split:
    """List and check ``data_root/split``; ``verify`` also checks the JPEG markers of every file."""
    data = Path(data_root)
    if not data.is_dir():
        raise DataError(f"{data}: data folder not found" if not data.exists() else f"{data}: not a folder")
    root = data / split
    if not root.is_dir():
        raise DataError(f"{root}: missing (expected {split}/CLASS/*.JPEG under {data})")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class folders (expected {split}/CLASS/*.JPEG)")
    stray = sorted(e.name for e in os.scandir(root) if e.is_file() and not e.name.startswith("."))
    if stray:
        raise DataError(f"{root / stray[0]}: a file where class folders are expected")
    files: list[str] = []
    labels: list[int] = []
    for label, c in enumerate(classes):
        names = sorted(e.name for e in os.scandir(root / c) if not e.name.startswith("."))
        if not names:
            raise DataError(f"{root / c}: empty class folder")
        for name in names:
            p = str(root / c / name)
            ext = os.path.splitext(name)[1].lower()
            if ext not in IMAGE_EXTENSIONS or not os.path.isfile(p):
                raise DataError(f"{p}: not an image file (expected one of {', '.join(IMAGE_EXTENSIONS)})")
            if verify and ext in JPEG_EXTENSIONS:
                check_jpeg(p)
            files.append(p)
            labels.append(label)
    return Split(root, tuple(classes), tuple(files), tuple(labels))


@dataclass(frozen=True)
class Shard:
    """The sample indices one rank reads in one epoch."""

    indices: tuple[int, ...]
    """Indices into the split's file list, in reading order; a multiple of the batch size long."""
    pad: int
    """How many of the trailing indices are wrap-around padding (repeats of samples read elsewhere)."""
    steps: int
    """Batches per epoch (the same on every rank)."""


def shard(n: int, rank: int, world_size: int, batch_size: int, *, epoch: int = 0, seed: int = 0,
          shuffle: bool = True) -> Shard:
    """Rank ``rank``'s share of an epoch over ``n`` samples (see the module docstring)."""
    if n < 1:
        raise ValueError("empty data set")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    order = list(range(n))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    per_step = world_size * batch_size
    total = steps_per_epoch(n, per_step) * per_step
    padded = order + [order[i % n] for i in range(total - n)]
    per_rank = total // world_size
    mine = padded[rank * per_rank:(rank + 1) * per_rank]
    pad = max(0, min(per_rank, (rank + 1) * per_rank - n))
    return Shard(tuple(mine), pad, per_rank // batch_size)
