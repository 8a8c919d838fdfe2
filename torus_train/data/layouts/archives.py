"""The layouts ImageNet ships in, as `torus-train data pack` reads them (no torch; scipy only for meta.mat).

    folder    DATA/train/WNID/*.JPEG and DATA/val/WNID/*.JPEG (the ImageNet layout torchvision's ImageFolder reads)
    archives  image-net.org's files side by side in DATA: ILSVRC2012_img_train.tar (a tar of one tar per class,
              WNID.tar, each holding WNID_N.JPEG), ILSVRC2012_img_val.tar (the validation images in one folder,
              ILSVRC2012_val_NNNNNNNN.JPEG) and ILSVRC2012_devkit_t12.tar.gz (or its extracted folder), whose
              data/ILSVRC2012_validation_ground_truth.txt gives image N's ILSVRC2012_ID on line N and whose
              data/meta.mat maps an ILSVRC2012_ID to its WNID and words
    kaggle    Kaggle's imagenet-object-localization-challenge: ILSVRC/Data/CLS-LOC/train/WNID/*.JPEG, a flat
              ILSVRC/Data/CLS-LOC/val/, LOC_val_solution.csv (ImageId,PredictionString; the string's first word
              is the WNID) and LOC_synset_mapping.txt ("WNID words" per line); test/ has no labels and is left out

Every layout is listed as the folder layout lists the same images: the classes are the sorted WNIDs (label i is
classes[i], as torchvision's ImageFolder and ImageNet number them, so a model trained here scores against their
labels) and a split's samples come in (class, file name) order, each named CLASS/FILE. The same images therefore
pack into the same set, byte for byte, whatever layout they came in. A validation image's label is looked up by
its name in the ground truth, never taken from its position.

Archive members are never extracted. The packer writes the training samples in a seeded random order, so it reads
them by position, as it reads a folder's files: each member's offset and size come from its tar header (the
headers are read once, the data skipped by a seek) and its bytes from one ``pread`` of the archive at that offset.
"""

from __future__ import annotations

import io
import os
import posixpath
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torus_train.data.index import IMAGE_EXTENSIONS, SPLITS, DataError, list_split, same_classes
from torus_train.errors import UserError
from torus_train.registry import Registry

Log = Callable[[str], None] | None
PROGRESS_SECONDS = 5.0
"""How often a long listing says how far it got."""


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
    """The listing (reads every tar header or directory once); DataError naming what does not fit."""


LAYOUTS: Registry[Layout] = Registry("data layout")


def find_layout(data: Path) -> Layout:
    """The layout DATA is in, its parts checked present; one line saying what was expected otherwise."""
    if not data.is_dir():
        raise DataError(f"{data}: data folder not found" if not data.exists() else f"{data}: not a folder")
    layout = next((lay for lay in LAYOUTS if lay.claims(data)), None)
    if layout is None:
        raise DataError(f"{data}: not a data set torus-train can pack; expected {expected()}")
    layout.check(data)
    return layout


def expected() -> str:
    """The layouts, for a message: 'an ImageNet-layout folder (...), or image-net.org's archives (...), or ...'."""
    return ", or ".join(lay.help for lay in LAYOUTS)


def open_source(data: Path, log: Log = None) -> Source:
    """DATA listed in whichever layout it is in."""
    return find_layout(data).open(data, log)


def _image_name(where: str, name: str) -> None:
    """A member or file that the folder layout would refuse is refused here too (so every layout packs the same)."""
    if os.path.splitext(name)[1].lower() not in IMAGE_EXTENSIONS:
        raise DataError(f"{where}: not an image file (expected one of {', '.join(IMAGE_EXTENSIONS)})")
    try:
        name.encode()
    except UnicodeEncodeError:
        raise DataError(f"{where.encode('utf-8', 'backslashreplace').decode()}: the name is not valid UTF-8") from None


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None


def _ordered(classes: tuple[str, ...], entries: list[tuple[int, str, Any]]) -> tuple[list, list[str], list[int]]:
    """(payloads, CLASS/FILE names, labels) of (label, file, payload) entries in the folder layout's order."""
    entries.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in entries], [f"{classes[e[0]]}/{e[1]}" for e in entries], [e[0] for e in entries]


class _Progress:
    """A line every PROGRESS_SECONDS while a long listing runs."""

    def __init__(self, log: Log, what: str):
        self.log, self.what, self.last = log, what, time.time()

    def __call__(self, text: str) -> None:
        if self.log and time.time() - self.last > PROGRESS_SECONDS:
            self.last = time.time()
            self.log(f"  listing {self.what}: {text}")


# --------------------------------------------------------------------------------------------------------
# folder: DATA/train/WNID/*, DATA/val/WNID/*
# --------------------------------------------------------------------------------------------------------
def _folder_claims(data: Path) -> bool:
    return any((data / s).is_dir() for s in SPLITS)


def _folder_check(data: Path) -> None:
    for split in SPLITS:
        if not (data / split).is_dir():
            raise DataError(f"{data}: not an ImageNet-layout folder ({split}/CLASS/* missing)")
    try:
        same_classes(data)
    except DataError:
        if data.parts[-3:] == tuple(KAGGLE_DATA.split("/")):  # Kaggle's folder of images, its flat val/ unlabelled
            raise DataError(
                f"{data}: Kaggle's {KAGGLE_DATA} (its val/ is flat, labelled by {SOLUTION}); give --data "
                f"{data.parents[2]}, the folder holding ILSVRC/ and {SOLUTION}"
            ) from None
        raise


def _folder_listing(folder: Path, names: list[str], labels: list[int]) -> Listing:
    return Listing(names, labels, lambda i: _read_file(folder / names[i]), lambda i: str(folder / names[i]))


def _folder_open(data: Path, log: Log) -> Source:
    splits: dict[str, Listing] = {}
    classes: tuple[str, ...] = ()
    for split in SPLITS:
        classes, names, labels = list_split(data, split)
        splits[split] = _folder_listing(data / split, names, labels)
    return Source("folder", data, classes, None, splits)


# --------------------------------------------------------------------------------------------------------
# archives: image-net.org's tars and devkit
# --------------------------------------------------------------------------------------------------------
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


def _archives_claims(data: Path) -> bool:
    return any((data / name).exists() for name in ARCHIVE_PARTS) or (data / DEVKIT_DIR).is_dir()


def _archives_check(data: Path) -> None:
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
    return DataError(f"{path}: not a readable tar ({e}); download it again")


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
            _image_name(f"{where}/{i.name}", name)
            files.append((name, m.offset_data + i.offset_data, i.size))
    if not files:
        raise DataError(f"{where}: a class's tar with no images")
    if len({f[0] for f in files}) != len(files):
        raise DataError(f"{where}: holds two images of one name")
    return files


def _list_train_tar(path: Path, log: Log) -> dict[str, list[tuple[str, int, int]]]:
    """WNID -> its images (name, offset, size) in the tar of per-class tars, from the headers alone."""
    per_class: dict[str, list[tuple[str, int, int]]] = {}
    progress, images = _Progress(log, path.name), 0
    try:
        with tarfile.open(path, mode="r:") as outer:
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
    except (tarfile.TarError, EOFError) as e:
        raise _tar_error(path, e) from None
    if not per_class:
        raise DataError(f"{path}: no class tars in it (expected WNID.tar, one per class)")
    return per_class


def _list_flat_tar(path: Path, log: Log) -> list[tuple[str, int, int]]:
    """(name, offset, size) of every image in a tar of image files (the validation tar)."""
    files, progress = [], _Progress(log, path.name)
    try:
        with tarfile.open(path, mode="r:") as tf:
            for m in _members(tf):
                if m.isdir() or posixpath.basename(m.name).startswith("."):  # hidden files: passed over
                    continue
                if not m.isfile():
                    raise DataError(f"{path}:{m.name}: not a regular file; only images belong in {path.name}")
                _image_name(f"{path}:{m.name}", m.name)
                files.append((posixpath.basename(m.name), m.offset_data, m.size))
                progress(f"{len(files):,} images")
    except (tarfile.TarError, EOFError) as e:
        raise _tar_error(path, e) from None
    return files


def _devkit_file(data: Path, member: str) -> tuple[bytes, str]:
    """(the bytes of ``member`` of the devkit, how to name it), from the tar.gz or else the extracted folder."""
    tgz = data / DEVKIT_TAR
    if not tgz.exists():
        path = data / DEVKIT_DIR / member
        return _read_file(path), str(path)
    try:
        with tarfile.open(tgz, mode="r:gz") as tf:
            for m in tf:
                f = tf.extractfile(m) if m.name == member or m.name.endswith("/" + member) else None
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


def ground_truth(raw: bytes, where: str) -> list[int]:
    """The ILSVRC2012_ID on each line: line N labels ILSVRC2012_val_N."""
    ids = []
    for n, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip().isdigit():
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
    locations, names, labels = _ordered(classes, entries)
    offsets = np.asarray([loc[0] for loc in locations], np.int64)
    sizes = np.asarray([loc[1] for loc in locations], np.int64)
    fd = os.open(path, os.O_RDONLY)
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


def _archives_open(data: Path, log: Log) -> Source:
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


# --------------------------------------------------------------------------------------------------------
# kaggle: ILSVRC/Data/CLS-LOC/{train/WNID/*, val/*}, LOC_val_solution.csv, LOC_synset_mapping.txt
# --------------------------------------------------------------------------------------------------------
KAGGLE_DATA = "ILSVRC/Data/CLS-LOC"
SOLUTION = "LOC_val_solution.csv"
SYNSET_MAPPING = "LOC_synset_mapping.txt"
SOLUTION_HEADER = "ImageId,PredictionString"


def _kaggle_claims(data: Path) -> bool:
    return (data / KAGGLE_DATA).is_dir() or (data / SOLUTION).exists() or (data / SYNSET_MAPPING).exists()


def _kaggle_check(data: Path) -> None:
    for part, what in (
        (f"{KAGGLE_DATA}/train", "the training images, one folder per class"),
        (f"{KAGGLE_DATA}/val", "the validation images"),
        (SOLUTION, "the validation labels"),
        (SYNSET_MAPPING, "the class names"),
    ):
        if not (data / part).exists():
            raise DataError(f"{data}: Kaggle's ImageNet layout without {part} ({what}); put it back from the download")


def read_solution(path: Path) -> dict[str, str]:
    """ImageId -> WNID from LOC_val_solution.csv (the first word of PredictionString; boxes follow it)."""
    lines = _read_file(path).decode("utf-8", "replace").splitlines()
    if not lines or lines[0].strip().lstrip("\ufeff") != SOLUTION_HEADER:
        raise DataError(f"{path} line 1: expected the header {SOLUTION_HEADER}, found {(lines or [''])[0][:60]!r}")
    wnids: dict[str, str] = {}
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        parts = line.split(",")
        words = parts[1].split() if len(parts) == 2 else []
        if len(parts) != 2 or not parts[0].strip() or not words or not words[0][:1].isalpha():
            raise DataError(
                f"{path} line {n}: {line[:60]!r} is not ImageId,PredictionString with the class first "
                f"(ILSVRC2012_val_00000001,n01751748 ...)"
            )
        image = parts[0].strip()
        if image in wnids:
            raise DataError(f"{path} line {n}: a second row for {image}")
        wnids[image] = words[0]
    return wnids


def read_synset_mapping(path: Path) -> dict[str, str]:
    """WNID -> words from LOC_synset_mapping.txt ("n01440764 tench, Tinca tinca" per line)."""
    words = {}
    for n, line in enumerate(_read_file(path).decode("utf-8", "replace").splitlines(), 1):
        wnid, _, text = line.strip().partition(" ")
        if not wnid or not text.strip():
            raise DataError(f"{path} line {n}: {line[:60]!r} is not 'WNID words' (n01440764 tench, Tinca tinca)")
        words[wnid] = text.strip()
    return words


def _kaggle_val(data: Path, classes: tuple[str, ...]) -> list[tuple[int, str, None]]:
    """(label, file name, None) of each image of the flat val/, its label from LOC_val_solution.csv."""
    folder, solution = data / KAGGLE_DATA / "val", data / SOLUTION
    truth, index = read_solution(solution), {c: i for i, c in enumerate(classes)}
    try:
        with os.scandir(folder) as it:
            files = sorted(e.name for e in it if not e.name.startswith("."))
    except OSError as e:
        raise DataError(f"{folder}: {e.strerror or e}") from None
    entries = []
    for name in files:
        _image_name(str(folder / name), name)
        wnid = truth.get(os.path.splitext(name)[0])
        if wnid is None:
            raise DataError(f"{folder / name}: no row for {os.path.splitext(name)[0]} in {solution}")
        if wnid not in index:
            raise DataError(f"{folder / name}: labelled {wnid} in {solution}, which is no class folder of train/")
        entries.append((index[wnid], name, None))
    if len(entries) != len(truth):
        raise DataError(
            f"{folder}: {len(entries):,} validation images, but {solution} labels {len(truth):,}; the download is "
            f"incomplete (or images were added)"
        )
    return entries


def _kaggle_open(data: Path, log: Log) -> Source:
    words = read_synset_mapping(data / SYNSET_MAPPING)
    classes, names, labels = list_split(data / KAGGLE_DATA, "train")
    if set(classes) != set(words):
        odd = sorted(set(classes) ^ set(words))[0]
        raise DataError(
            f"{data / SYNSET_MAPPING}: its classes are not train/'s ({odd} is in only one); they belong to "
            f"different downloads"
        )
    val_root = data / KAGGLE_DATA / "val"
    _, val_files, val_labels = _ordered(classes, _kaggle_val(data, classes))
    val_names = [n.split("/", 1)[1] for n in val_files]
    val = Listing(
        val_files, val_labels, lambda i: _read_file(val_root / val_names[i]), lambda i: str(val_root / val_names[i])
    )
    train = _folder_listing(data / KAGGLE_DATA / "train", names, labels)
    return Source("kaggle", data, classes, tuple(words[c] for c in classes), {"train": train, "val": val})


# In the order they are tried: a folder holding train/ or val/ is the ImageNet layout (also when the archives lie
# beside it: what it packed before, it packs now); else the archives and Kaggle's layout, told by their file names.
LAYOUTS.add(
    "folder",
    Layout(
        "folder",
        "an ImageNet-layout folder (train/WNID/*.JPEG, val/WNID/*.JPEG)",
        _folder_claims,
        _folder_check,
        _folder_open,
    ),
)
LAYOUTS.add(
    "archives",
    Layout(
        "archives",
        f"image-net.org's archives ({TRAIN_TAR}, {VAL_TAR}, {DEVKIT_TAR})",
        _archives_claims,
        _archives_check,
        _archives_open,
    ),
)
LAYOUTS.add(
    "kaggle",
    Layout(
        "kaggle",
        f"Kaggle's layout ({KAGGLE_DATA}/train/WNID/*, {KAGGLE_DATA}/val/*, {SOLUTION}, {SYNSET_MAPPING})",
        _kaggle_claims,
        _kaggle_check,
        _kaggle_open,
    ),
)
