"""What every layout gives the packer (no torch): a ``Source`` of two ``Listing``s, and the helpers the layouts
share (a file name refused as the folder layout refuses it, an image read through the door, the folder layout's
order, a progress line).

Every layout is listed as the folder layout lists the same images: the classes are the sorted WNIDs (label i is
classes[i], as torchvision's ImageFolder and ImageNet number them, so a model trained here scores against their
labels) and a split's samples come in (class, file name) order, each named CLASS/FILE. The same images therefore
pack into the same set, byte for byte, whatever layout they came in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torus_train.data.checks import MAX_IMAGE_BYTES
from torus_train.data.index import IMAGE_EXTENSIONS, DataError
from torus_train.userfiles import read_bytes

Log = Callable[[str], None] | None
PROGRESS_SECONDS = 5.0
"""How often a long listing says how far it got."""
WHERE = "--data"
"""How a file of the data set is named in the door's messages: the flag that named the set."""
MAX_TEXT_BYTES = 64 << 20
"""The largest label or name file a layout reads (LOC_val_solution.csv, the largest, is about 5 MB)."""


@dataclass
class Listing:
    """One split as the packer reads it: sample i is ``names[i]`` (CLASS/FILE) with ``labels[i]``; ``read(i)``
    gives its encoded bytes and ``where(i)`` names it in messages (a path, or ARCHIVE:MEMBER)."""

    names: list[str]
    labels: list[int]
    read: Callable[[int], bytes]
    where: Callable[[int], str]


@dataclass
class Source:
    """A data set in one of the layouts, listed: its classes (sorted WNIDs), their words where the layout
    gives them, and both splits."""

    layout: str
    root: Path
    classes: tuple[str, ...]
    class_names: tuple[str, ...] | None
    """classes[i]'s words ("tench, Tinca tinca"), from meta.mat or LOC_synset_mapping.txt; None: not given."""
    splits: dict[str, Listing]
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in self.closers:
            c()


@dataclass(frozen=True)
class Layout:
    """One way ImageNet is laid out on disk."""

    name: str
    help: str
    """One line for the docs and messages: what the folder holds."""
    claims: Callable[[Path], bool]
    """Whether DATA is (even partly) of this layout, by the names in it alone."""
    check: Callable[[Path], None]
    """DataError naming the first missing part (cheap: before the pack target is checked or anything is read)."""
    open: Callable[[Path, Log], Source]
    """The listing (reads every tar header or directory once); DataError naming what does not fit. Every file
    it reads or will read is a regular file (checked by its entry's type, or by the door when it is opened)."""


def image_name(where: str, name: str) -> None:
    """A member or file that the folder layout would refuse is refused here too (so every layout packs the same)."""
    if os.path.splitext(name)[1].lower() not in IMAGE_EXTENSIONS:
        raise DataError(f"{where}: not an image file (expected one of {', '.join(IMAGE_EXTENSIONS)})")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise DataError(f"{where.encode('utf-8', 'backslashreplace').decode()}: the name is not valid UTF-8") from None


def read_image(path: Path) -> bytes:
    """An image file's bytes, through the door (a regular file of at most MAX_IMAGE_BYTES)."""
    return read_bytes(path, WHERE, MAX_IMAGE_BYTES)


def folder_listing(folder: Path, names: list[str], labels: list[int]) -> Listing:
    """A split whose samples are the files ``folder/CLASS/FILE`` (the folder layout's, Kaggle's train/)."""
    return Listing(names, labels, lambda i: read_image(folder / names[i]), lambda i: str(folder / names[i]))


def ordered(classes: tuple[str, ...], entries: list[tuple[int, str, Any]]) -> tuple[list, list[str], list[int]]:
    """(payloads, CLASS/FILE names, labels) of (label, file, payload) entries in the folder layout's order."""
    entries.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in entries], [f"{classes[e[0]]}/{e[1]}" for e in entries], [e[0] for e in entries]


class Progress:
    """A line every PROGRESS_SECONDS while a long listing runs."""

    def __init__(self, log: Log, what: str):
        self.log, self.what, self.last = log, what, time.time()

    def __call__(self, text: str) -> None:
        if self.log and time.time() - self.last > PROGRESS_SECONDS:
            self.last = time.time()
            self.log(f"  listing {self.what}: {text}")
