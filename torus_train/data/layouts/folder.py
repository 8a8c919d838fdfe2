"""The ImageNet layout as `torus-train data pack` reads it (no torch): DATA/train/WNID/*.JPEG and
DATA/val/WNID/*.JPEG, the layout torchvision's ImageFolder reads, listed by data/index.py's scan."""

from __future__ import annotations

from pathlib import Path

from torus_train.data.index import SPLITS, DataError, list_split, same_classes
from torus_train.data.layouts.base import Layout, Listing, Log, Source, folder_listing
from torus_train.data.layouts.kaggle import KAGGLE_DATA, SOLUTION


def _claims(data: Path) -> bool:
    return any((data / s).is_dir() for s in SPLITS)


def _check(data: Path) -> None:
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


def _open(data: Path, log: Log) -> Source:
    splits: dict[str, Listing] = {}
    classes: tuple[str, ...] = ()
    for split in SPLITS:
        classes, names, labels = list_split(data, split)  # refuses an entry that is not a regular file
        splits[split] = folder_listing(data / split, names, labels)
    return Source("folder", data, classes, None, splits)


LAYOUT = Layout(
    "folder",
    "an ImageNet-layout folder (train/WNID/*.JPEG, val/WNID/*.JPEG)",
    _claims,
    _check,
    _open,
)
