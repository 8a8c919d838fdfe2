"""Small real data sets for the data tests: JPEG files whose colour encodes their index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def index_colour(i: int) -> tuple[int, int, int]:
    """A colour that survives JPEG, crops, flips and resizing: index i <= 255 in two 16-level channels."""
    return (i // 16) * 16 + 8, (i % 16) * 16 + 8, 128


def colour_index(rgb) -> int:
    """Inverse of index_colour for a decoded mean colour (0..255)."""
    r, g = float(rgb[0]), float(rgb[1])
    return round((r - 8) / 16) * 16 + round((g - 8) / 16)


def make_index_set(root: Path, n_train: int = 90, n_val: int = 30, classes: int = 3, size: int = 40) -> Path:
    """train/ and val/ with solid-colour JPEGs; file k of a split has colour index_colour(k)."""
    for split, n in (("train", n_train), ("val", n_val)):
        for c in range(classes):
            (root / split / f"c{c}").mkdir(parents=True, exist_ok=True)
        # Files are listed sorted by class then name, so number them in that order.
        per = [list(range(c, n, classes)) for c in range(classes)]
        k = 0
        for c in range(classes):
            for j in per[c]:
                img = Image.fromarray(np.full((size, size + 8, 3), index_colour(k), np.uint8))
                img.save(root / split / f"c{c}" / f"{j:04d}.JPEG", quality=95)
                k += 1
    return root


def wreck_jpeg(path: Path) -> None:
    """Zero a JPEG's tables (quantisation, Huffman, frame header) and keep its start, its scan and its end
    marker: the content check passes (checks.content_problem), every decoder fails (PIL, torchvision, DALI)."""
    data = bytearray(path.read_bytes())
    sos = data.index(b"\xff\xda")
    data[20:sos] = bytes(sos - 20)
    path.write_bytes(bytes(data))


def decode_indices(images, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) -> list[int]:
    """Undo the normalisation of a [B,3,H,W] batch and read each image's index from its mean colour."""
    import torch

    m = torch.tensor(mean).view(1, 3) * 255
    s = torch.tensor(std).view(1, 3) * 255
    rgb = images.float().mean(dim=(2, 3)) * s + m
    return [colour_index(row) for row in rgb.tolist()]
