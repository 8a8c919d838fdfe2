"""image-net.org's archives, as `torus-train data pack` reads them in place (no torch; scipy only for meta.mat).

ILSVRC2012_img_train.tar (a tar of one tar per class, WNID.tar, each holding WNID_N.JPEG), ILSVRC2012_img_val.tar
(the validation images in one folder, ILSVRC2012_val_NNNNNNNN.JPEG) and ILSVRC2012_devkit_t12.tar.gz (or its
extracted folder), whose data/ILSVRC2012_validation_ground_truth.txt gives image N's ILSVRC2012_ID on line N and
whose data/meta.mat maps an ILSVRC2012_ID to its WNID and words. A validation image's label is looked up by its
number in the ground truth, never taken from its position.

Archive members are never extracted. The packer writes the training samples in a seeded random order, so it reads
them by position, as it reads a folder's files: each member's offset and size come from its tar header (the
headers are read once, the data skipped by a seek) and its bytes from one ``pread`` of the archive at that offset.
Every archive and devkit file is opened through the door (torus_train/userfiles.py): a FIFO or a device there is
refused by name, never opened to block.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from torus_train.data.index import DataError
from torus_train.data.layouts.base import (
    MAX_TEXT_BYTES,
    WHERE,
    Layout,
    Listing,
    Log,
    Progress,
    Source,
    image_name,
    ordered,
)
from torus_train.errors import UserError
from torus_train.userfiles import open_fd, open_regular, read_bytes

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
DEVKIT_TAR = "ILSVRC2012_devkit_t12.tar.gz"
DEVKIT_DIR = "ILSVRC2012_devkit_t12"
GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
META_MAT = "data/meta.mat"
VAL_NAME = re.compile(r"ILSVRC2012_val_([0-9]{8})\.JPEG")
ARCHIVE_PARTS = {
    TRAIN_TAR: "the training images",
    VAL_TAR: "the validation images",
    DEVKIT_TAR: f"the validation labels: {GROUND_TRUTH} and {META_MAT}",
}


def _claims(data: Path) -> bool:
    return any((data / name).exists() for name in ARCHIVE_PARTS) or (data / DEVKIT_DIR).is_dir()


def _check(data: Path) -> None:
    have = [n for n in ARCHIVE_PARTS if (data / n).exists() or (n == DEVKIT_TAR and (data / DEVKIT_DIR).is_dir())]
    missing = [n for n in ARCHIVE_PARTS if n not in have]
    if missing:
        raise DataError(
            f"{data}: {', '.join(have)} here but {missing[0]} missing ({ARCHIVE_PARTS[missing[0]]}); put it beside "
            f"the others (image-net.org, ILSVRC2012 downloads)"
        )


def _members(tf: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """A tar's members one by one from their headers (each member's data is skipped by a seek), without the list
    tarfile keeps of every member read (1.28 million TarInfo objects would take gigabytes)."""
    while (m := tf.next()) is not None:
        tf.members.clear()  # type: ignore[attr-defined]  # TarFile's own list (getmembers() returns it)
        yield m


def _tar_error(path: Path, e: Exception) -> DataError:
    return DataError(f"{path}: not a readable tar ({getattr(e, 'strerror', None) or e}); download it again")


def _class_tar(outer: tarfile.TarFile, m: tarfile.TarInfo, where: str) -> list[tuple[str, int, int]]:
    """(file name, offset in the outer tar, size) of each image in the per-class tar ``m`` of ``outer``."""
    files = []
    with tarfile.open(fileobj=outer.extractfile(m), mode="r:") as inner:
        for i in _members(inner):
            name = posixpath.basename(i.name)
            if i.isdir() or name.startswith("."):  # hidden files: passed over, as in a folder
                continue
            if not i.isfile():
                raise DataError(f"{where}/{i.name}: not a regular file; only images belong in a class's tar")
            image_name(f"{where}/{i.name}", name)
            files.append((name, m.offset_data + i.offset_data, i.size))
    if not files:
        raise DataError(f"{where}: a class's tar with no images")
    if len({f[0] for f in files}) != len(files):
        raise DataError(f"{where}: holds two images of one name")
    return files


def _list_train_tar(path: Path, log: Log) -> dict[str, list[tuple[str, int, int]]]:
    """WNID -> its images (name, offset, size) in the tar of per-class tars, from the headers alone."""
    per_class: dict[str, list[tuple[str, int, int]]] = {}
    progress, images = Progress(log, path.name), 0
    try:
        with open_regular(path, WHERE) as f, tarfile.open(fileobj=f, mode="r:") as outer:
            for m in _members(outer):
                if m.isdir():
                    continue
                wnid, ext = posixpath.splitext(posixpath.basename(m.name))
                if not m.isfile() or ext != ".tar" or not wnid:
                    raise DataError(f"{path}:{m.name}: not a class's tar; {path.name} holds one WNID.tar per class")
                if wnid in per_class:
                    raise DataError(f"{path}:{m.name}: a second tar of class {wnid}")
                per_class[wnid] = _class_tar(outer, m, f"{path}:{m.name}")
                images += len(per_class[wnid])
                progress(f"{len(per_class):,} classes, {images:,} images")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise _tar_error(path, e) from None
    if not per_class:
        raise DataError(f"{path}: no class tars in it (expected WNID.tar, one per class)")
    return per_class


def _list_flat_tar(path: Path, log: Log) -> list[tuple[str, int, int]]:
    """(name, offset, size) of every image in a tar of image files (the validation tar)."""
    files, progress = [], Progress(log, path.name)
    try:
        with open_regular(path, WHERE) as f, tarfile.open(fileobj=f, mode="r:") as tf:
            for m in _members(tf):
                if m.isdir() or posixpath.basename(m.name).startswith("."):  # hidden files: passed over
                    continue
                if not m.isfile():
                    raise DataError(f"{path}:{m.name}: not a regular file; only images belong in {path.name}")
                image_name(f"{path}:{m.name}", m.name)
                files.append((posixpath.basename(m.name), m.offset_data, m.size))
                progress(f"{len(files):,} images")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise _tar_error(path, e) from None
    return files


def _devkit_file(data: Path, member: str) -> tuple[bytes, str]:
    """(the bytes of ``member`` of the devkit, how to name it), from the tar.gz or else the extracted folder."""
    tgz = data / DEVKIT_TAR
    if not tgz.exists():
        path = data / DEVKIT_DIR / member
        return read_bytes(path, WHERE, MAX_TEXT_BYTES), str(path)
    try:
        with open_regular(tgz, WHERE) as raw, tarfile.open(fileobj=raw, mode="r:gz") as tf:
            for m in tf:
                f = tf.extractfile(m) if m.name == member or m.name.endswith("/" + member) else None
                if f is not None and m.size > MAX_TEXT_BYTES:
                    raise DataError(
                        f"{tgz}:{m.name}: {m.size:,} bytes, larger than the devkit's files; download it again"
                    )
                if f is not None:  # a regular file of that name (extractfile gives None for anything else)
                    return f.read(), f"{tgz}:{m.name}"
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(
            f"{tgz}: not a readable tar.gz ({getattr(e, 'strerror', None) or e}); download it again"
        ) from None
    raise DataError(f"{tgz}: holds no {member}; it is not the ILSVRC2012 devkit, download it again")


def parse_meta_mat(raw: bytes, where: str) -> dict[int, tuple[str, str]]:
    """ILSVRC2012_ID -> (WNID, words) of meta.mat's leaf synsets (num_children 0: the 1,000 classes; the others
    are WordNet's inner nodes), as torchvision's ImageNet reads it."""
    try:
        from scipy.io import loadmat
    except ImportError:
        raise UserError(f"{where}: reading the devkit's meta.mat needs scipy (pip install scipy)") from None
    try:
        s = loadmat(io.BytesIO(raw), squeeze_me=True)["synsets"]
        rows = zip(s["ILSVRC2012_ID"], s["WNID"], s["words"], s["num_children"], strict=True)
        return {int(i): (str(w), str(t)) for i, w, t, n in rows if int(n) == 0}
    except Exception as e:  # scipy raises many kinds on a file that is not a MATLAB file or lacks the fields
        raise DataError(f"{where}: not the devkit's meta.mat (synsets with ILSVRC2012_ID, WNID, words: {e})") from None


GROUND_TRUTH_ID = re.compile(r"[0-9]{1,9}")
"""An ILSVRC2012_ID as the ground truth writes it (1 to 1000): ASCII digits only (str.isdigit also takes "²", which
int() refuses) and few of them (int() refuses more than 4,300 digits)."""


def ground_truth(raw: bytes, where: str) -> list[int]:
    """The ILSVRC2012_ID on each line: line N labels ILSVRC2012_val_N."""
    ids = []
    for n, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        if not GROUND_TRUTH_ID.fullmatch(line.strip()):
            raise DataError(f"{where} line {n}: {line.strip()[:40]!r} is not an ILSVRC2012_ID (one number a line)")
        ids.append(int(line))
    return ids


def _val_wnids(data: Path, val: list, synsets: dict, path: Path) -> list[str]:
    """The WNID of each validation image, from the ground-truth line its file number names (read before the
    training archive's long listing, so a devkit that does not fit is said at once)."""
    raw, where = _devkit_file(data, GROUND_TRUTH)
    truth = ground_truth(raw, where)
    if len(truth) != len(val):
        raise DataError(
            f"{path}: {len(val):,} validation images, but {where} labels {len(truth):,}; the archive or the devkit "
            f"is incomplete (download it again)"
        )
    wnids, seen = [], set()
    for name, _, _ in val:
        m = VAL_NAME.fullmatch(name)
        number = int(m.group(1)) if m else 0
        if not m or not 1 <= number <= len(truth) or number in seen:
            why = "not named ILSVRC2012_val_NNNNNNNN.JPEG" if not m else "no ground-truth line of its number"
            raise DataError(f"{path}:{name}: {'a second image of its number' if number in seen else why}")
        seen.add(number)
        if truth[number - 1] not in synsets:
            raise DataError(f"{where} line {number}: ILSVRC2012_ID {truth[number - 1]} is no class of meta.mat")
        wnids.append(synsets[truth[number - 1]][0])
    return wnids


def _archive_listing(path: Path, entries: list, classes: tuple[str, ...], closers: list, nested: bool) -> Listing:
    """Reads sample i with one pread of the archive at the offset its header gave (``nested``: the per-class tars
    of the training archive, named ARCHIVE:WNID.tar/FILE in messages; else ARCHIVE:FILE)."""
    locations, names, labels = ordered(classes, entries)
    offsets = np.asarray([loc[0] for loc in locations], np.int64)
    sizes = np.asarray([loc[1] for loc in locations], np.int64)
    fd = open_fd(path, WHERE)
    closers.append(lambda: os.close(fd))

    def where(i: int) -> str:
        wnid, name = names[i].split("/", 1)
        return f"{path}:{wnid}.tar/{name}" if nested else f"{path}:{name}"

    return Listing(names, labels, lambda i: _pread(fd, int(sizes[i]), int(offsets[i]), lambda: where(i)), where)


def _pread(fd: int, size: int, offset: int, where: Callable[[], str]) -> bytes:
    """``size`` bytes at ``offset`` (pread may return fewer at a time: read on until all are there)."""
    try:
        data = os.pread(fd, size, offset)
        while len(data) < size:
            more = os.pread(fd, size - len(data), offset + len(data))
            if not more:
                raise DataError(f"{where()}: the archive ends inside this image (truncated); download it again")
            data += more
    except OSError as e:
        raise DataError(f"{where()}: cannot read ({e.strerror or e})") from None
    return data


def _open(data: Path, log: Log) -> Source:
    raw, where = _devkit_file(data, META_MAT)
    synsets = parse_meta_mat(raw, where)
    val = _list_flat_tar(data / VAL_TAR, log)
    val_wnids = _val_wnids(data, val, synsets, data / VAL_TAR)
    per_class = _list_train_tar(data / TRAIN_TAR, log)  # the long listing last: the devkit's faults come first
    classes = tuple(sorted(per_class))
    words, index = dict(synsets.values()), {c: i for i, c in enumerate(classes)}
    unnamed = [c for c in classes if c not in words]
    if unnamed:
        raise DataError(f"{where}: no synset for class {unnamed[0]} of {TRAIN_TAR}; the devkit does not belong to it")
    stray = next(((v[0], w) for v, w in zip(val, val_wnids, strict=True) if w not in index), None)
    if stray:
        raise DataError(
            f"{data / VAL_TAR}:{stray[0]}: of class {stray[1]} by the ground truth, which {TRAIN_TAR} has no tar "
            f"of; the archives do not belong together"
        )
    closers: list = []
    train = [(k, name, (off, size)) for k, c in enumerate(classes) for name, off, size in per_class[c]]
    val_entries = [(index[w], v[0], v[1:]) for v, w in zip(val, val_wnids, strict=True)]
    splits = {
        "train": _archive_listing(data / TRAIN_TAR, train, classes, closers, nested=True),
        "val": _archive_listing(data / VAL_TAR, val_entries, classes, closers, nested=False),
    }
    return Source("archives", data, classes, tuple(words[c] for c in classes), splits, closers)


LAYOUT = Layout(
    "archives",
    f"image-net.org's archives ({TRAIN_TAR}, {VAL_TAR}, {DEVKIT_TAR})",
    _claims,
    _check,
    _open,
)
