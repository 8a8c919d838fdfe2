"""The layouts ImageNet ships in, as `torus-train data pack` reads them (no torch; scipy only for meta.mat).

    folder    DATA/train/WNID/*.JPEG and DATA/val/WNID/*.JPEG (the ImageNet layout torchvision's ImageFolder reads)
    archives  image-net.org's files side by side in DATA: ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and
              ILSVRC2012_devkit_t12.tar.gz (or its extracted folder), read in place (archives.py)
    kaggle    Kaggle's imagenet-object-localization-challenge: ILSVRC/Data/CLS-LOC/{train/WNID/*, val/*},
              LOC_val_solution.csv and LOC_synset_mapping.txt (kaggle.py)

Each is one module with one ``Layout`` (base.py), listed here in the order they are tried. Every layout is listed
as the folder layout lists the same images (base.py says how), so the same images pack into the same set, byte
for byte, whatever layout they came in.
"""

from __future__ import annotations

from pathlib import Path

from torus_train.data.index import SPLITS, DataError
from torus_train.data.layouts import archives, folder, kaggle
from torus_train.data.layouts.base import Layout, Log, Source
from torus_train.registry import Registry

LAYOUTS: Registry[Layout] = Registry("data layout")
# In the order they are tried: a folder holding train/ or val/ is the ImageNet layout (also when the archives lie
# beside it: what it packed before, it packs now); else the archives and Kaggle's layout, told by their file names.
for _layout in (folder.LAYOUT, archives.LAYOUT, kaggle.LAYOUT):
    LAYOUTS.add(_layout.name, _layout)


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


def open_source(data: Path, log: Log = None, layout: Layout | None = None) -> Source:
    """DATA listed in whichever layout it is in (``layout`` when already found), both splits holding images: a
    layout whose labels match its images count for count would otherwise pack an empty split (0 labels for 0
    images), which the folder layout refuses."""
    source = (layout or find_layout(data)).open(data, log)
    try:
        for split in SPLITS:
            if not source.splits[split].names:
                raise DataError(
                    f"{data}: its {split} split holds no images ({LAYOUTS.get(source.layout).help}); a data set "
                    f"needs images in both splits"
                )
    except BaseException:
        source.close()
        raise
    return source
