#!/usr/bin/env python
"""Write an ImageNet-layout folder of photo-sized, photo-like JPEGs for input-pipeline benchmarks.

    python scripts/photo_like_set.py --out /tmp/photolike [--classes 8] [--per-class 50] [--size 500x375]

The demo set's images are small and smooth, which JPEG decodes unusually fast; photographs carry texture at
every scale. These images are 500x375 (the size of many ImageNet photographs), built from a colour gradient,
noise blurred at three scales (coarse shapes to fine grain), a few sharp-edged ellipses and pixel noise,
saved at quality 90 with 4:2:0 chroma subsampling: their JPEG size (~50-80 KB) is close to ImageNet's average
(~110 KB at 400x350), unlike the demo set's ~2 KB.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


def one_image(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        a, b, d = rng.uniform(-1, 1, 3)
        base[..., c] = 128 + 60 * (a * xx / w + b * yy / h) + 30 * d
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    for radius, amp in ((24, 70), (6, 45), (1.2, 30)):  # texture at three scales
        noise = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).filter(
            ImageFilter.GaussianBlur(radius)
        )
        n = (np.asarray(noise, np.float32) - 127.5) * (amp / 40.0)
        img = Image.fromarray(np.clip(np.asarray(img, np.float32) + n, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 8))):
        x0, y0 = rng.integers(0, w), rng.integers(0, h)
        x1, y1 = x0 + rng.integers(*_extent(w)), y0 + rng.integers(*_extent(h))
        draw.ellipse([int(x0), int(y0), int(x1), int(y1)], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    arr = np.asarray(img, np.float32) + rng.normal(0, 6, (h, w, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _extent(side: int) -> tuple[int, int]:
    """An ellipse's extent range along a side: 20 px to half the side, narrower on toy sizes."""
    low = max(1, min(20, side // 4))
    return low, max(low + 1, side // 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=50)
    ap.add_argument("--val-per-class", type=int, default=2)
    ap.add_argument("--size", default="500x375")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        ap.error(f"--size {args.size}: expected WIDTHxHEIGHT, e.g. 500x375")
    if min(w, h, args.classes, args.per_class + args.val_per_class) < 1 or min(args.per_class, args.val_per_class) < 0:
        ap.error("--size sides and --classes must be >= 1, --per-class and --val-per-class >= 0 (not both 0)")
    rng = np.random.default_rng(args.seed)
    total = 0
    for split, per in (("train", args.per_class), ("val", args.val_per_class)):
        for c in range(args.classes):
            d = Path(args.out) / split / f"class{c:02d}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per):
                one_image(rng, w, h).save(d / f"img{i:04d}.JPEG", quality=90, subsampling=2)
                total += 1
    size = sum(p.stat().st_size for p in Path(args.out).rglob("*.JPEG"))
    print(f"wrote {total} JPEGs of {w}x{h} to {args.out}, {size / total / 1024:.0f} KB each on average")


if __name__ == "__main__":
    main()
