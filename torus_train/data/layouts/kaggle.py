"""Kaggle's imagenet-object-localization-challenge, as `torus-train data pack` reads it (no torch).

ILSVRC/Data/CLS-LOC/train/WNID/*.JPEG, a flat ILSVRC/Data/CLS-LOC/val/, LOC_val_solution.csv (ImageId,
PredictionString; the string's first word is the WNID) and LOC_synset_mapping.txt ("WNID words" per line); test/
has no labels and is left out. A validation image's label is looked up by its name in the solution, never taken
from its position.
"""

from __future__ import annotations

import os
from pathlib import Path

from torus_train.data.index import DataError, list_split
from torus_train.data.layouts.base import (
    MAX_TEXT_BYTES,
    WHERE,
    Layout,
    Listing,
    Log,
    Source,
    folder_listing,
    image_name,
    ordered,
    read_image,
)
from torus_train.userfiles import read_bytes

KAGGLE_DATA = "ILSVRC/Data/CLS-LOC"
SOLUTION = "LOC_val_solution.csv"
SYNSET_MAPPING = "LOC_synset_mapping.txt"
SOLUTION_HEADER = "ImageId,PredictionString"


def _claims(data: Path) -> bool:
    return (data / KAGGLE_DATA).is_dir() or (data / SOLUTION).exists() or (data / SYNSET_MAPPING).exists()


def _check(data: Path) -> None:
    for part, what in (
        (f"{KAGGLE_DATA}/train", "the training images, one folder per class"),
        (f"{KAGGLE_DATA}/val", "the validation images"),
        (SOLUTION, "the validation labels"),
        (SYNSET_MAPPING, "the class names"),
    ):
        if not (data / part).exists():
            raise DataError(f"{data}: Kaggle's ImageNet layout without {part} ({what}); put it back from the download")


def _lines(path: Path) -> list[str]:
    """A label file's lines, read through the door (a regular file of at most MAX_TEXT_BYTES)."""
    return read_bytes(path, WHERE, MAX_TEXT_BYTES).decode("utf-8", "replace").splitlines()


def read_solution(path: Path) -> dict[str, str]:
    """ImageId -> WNID from LOC_val_solution.csv (the first word of PredictionString; boxes follow it)."""
    lines = _lines(path)
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
    for n, line in enumerate(_lines(path), 1):
        wnid, _, text = line.strip().partition(" ")
        if not wnid or not text.strip():
            raise DataError(f"{path} line {n}: {line[:60]!r} is not 'WNID words' (n01440764 tench, Tinca tinca)")
        words[wnid] = text.strip()
    return words


def _val_files(folder: Path) -> list[str]:
    """The file names of the flat val/, each a regular file (by its entry's type: a FIFO, a device, a folder or
    a broken link is refused by name before anything is opened, as the folder layout refuses one)."""
    try:
        with os.scandir(folder) as it:
            entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        for e in entries:
            image_name(str(folder / e.name), e.name)
            if not e.is_file():  # follows a link: a link to a regular file is one
                what = "a folder" if e.is_dir() else "not a regular file (a broken link, a FIFO or a device)"
                raise DataError(f"{folder / e.name}: {what}, not an image; only image files belong in {folder}")
    except OSError as e:
        raise DataError(f"{folder}: {e.strerror or e}") from None
    return [e.name for e in entries]


def _val(data: Path, classes: tuple[str, ...]) -> list[tuple[int, str, None]]:
    """(label, file name, None) of each image of the flat val/, its label from LOC_val_solution.csv."""
    folder, solution = data / KAGGLE_DATA / "val", data / SOLUTION
    truth, index = read_solution(solution), {c: i for i, c in enumerate(classes)}
    entries = []
    for name in _val_files(folder):
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


def _open(data: Path, log: Log) -> Source:
    words = read_synset_mapping(data / SYNSET_MAPPING)
    classes, names, labels = list_split(data / KAGGLE_DATA, "train")
    if set(classes) != set(words):
        odd = sorted(set(classes) ^ set(words))[0]
        raise DataError(
            f"{data / SYNSET_MAPPING}: its classes are not train/'s ({odd} is in only one); they belong to "
            f"different downloads"
        )
    val_root = data / KAGGLE_DATA / "val"
    _, val_files, val_labels = ordered(classes, _val(data, classes))
    val_names = [n.split("/", 1)[1] for n in val_files]
    val = Listing(
        val_files, val_labels, lambda i: read_image(val_root / val_names[i]), lambda i: str(val_root / val_names[i])
    )
    train = folder_listing(data / KAGGLE_DATA / "train", names, labels)
    return Source("kaggle", data, classes, tuple(words[c] for c in classes), {"train": train, "val": val})


LAYOUT = Layout(
    "kaggle",
    f"Kaggle's layout ({KAGGLE_DATA}/train/WNID/*, {KAGGLE_DATA}/val/*, {SOLUTION}, {SYNSET_MAPPING})",
    _claims,
    _check,
    _open,
)
