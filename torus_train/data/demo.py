"""The demo data set: ten shape classes drawn as real JPEG files in ImageNet layout (numpy + PIL, no torch).

Every image is a function of (seed, split, index) alone, so the set is identical wherever it is generated.
The class is the shape; everything else varies: position, scale, rotation, colour of shape and background,
a background gradient, clutter (lines, dots and a partial outline that belong to no class), Gaussian noise
and the JPEG quality. A linear classifier on raw pixels does poorly on it; a small convnet does well.

Layout: ``OUT/train/NN_name/NNNNN.JPEG``, ``OUT/val/NN_name/NNNNN.JPEG`` and ``OUT/demo.json`` (written last:
a folder without it is an interrupted generation and is regenerated).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from torus_train.cache import cache_root
from torus_train.data import folder
from torus_train.data.base import LoaderRequest
from torus_train.data.index import ensure_index
from torus_train.errors import UserError
from torus_train.userfiles import read_json

VERSION = 4
CLASSES = ("disk", "ring", "triangle", "square", "bar", "star", "cross", "crescent", "frame", "ell")
_SPLIT_ID = {"train": 1, "val": 2}
_SS = 4  # supersampling factor for anti-aliased shapes


def default_cache_dir() -> Path:
    """$TORUS_TRAIN_CACHE, or ~/.cache/torus-train, plus a content-versioned folder name."""
    return cache_root() / f"demo-v{VERSION}"


def _polygon(n: int, r: float, rot: float, cx: float, cy: float, inner: float | None = None) -> list:
    pts = []
    k = 2 * n if inner else n
    for i in range(k):
        a = rot + 2 * math.pi * i / k
        rr = r if (not inner or i % 2 == 0) else r * inner
        pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return pts


def _rotated(points: list, rot: float, cx: float, cy: float) -> list:
    c, s = math.cos(rot), math.sin(rot)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in points]


def _draw_shape(d: ImageDraw.ImageDraw, cls: int, cx: float, cy: float, r: float, rot: float, fill, bg) -> None:
    """Draw class ``cls`` centred at (cx, cy) with outer radius r (pixels of the supersampled canvas)."""
    name = CLASSES[cls]
    if name == "disk":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif name == "ring":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        ri = r * 0.55
        d.ellipse([cx - ri, cy - ri, cx + ri, cy + ri], fill=bg)
    elif name == "triangle":
        d.polygon(_polygon(3, r, rot, cx, cy), fill=fill)
    elif name == "square":
        d.polygon(_polygon(4, r, rot, cx, cy), fill=fill)
    elif name == "bar":
        w, h = r, r * 0.3
        d.polygon(_rotated([(-w, -h), (w, -h), (w, h), (-w, h)], rot, cx, cy), fill=fill)
    elif name == "star":
        d.polygon(_polygon(5, r, rot, cx, cy, inner=0.42), fill=fill)
    elif name == "cross":
        a, b = r, r * 0.3
        pts = [
            (-b, -a),
            (b, -a),
            (b, -b),
            (a, -b),
            (a, b),
            (b, b),
            (b, a),
            (-b, a),
            (-b, b),
            (-a, b),
            (-a, -b),
            (-b, -b),
        ]
        d.polygon(_rotated(pts, rot, cx, cy), fill=fill)
    elif name == "crescent":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        ox, oy = cx + 0.5 * r * math.cos(rot), cy + 0.5 * r * math.sin(rot)
        ri = r * 0.85
        d.ellipse([ox - ri, oy - ri, ox + ri, oy + ri], fill=bg)
    elif name == "frame":
        d.polygon(_polygon(4, r, rot, cx, cy), fill=fill)
        d.polygon(_polygon(4, r * 0.55, rot, cx, cy), fill=bg)
    elif name == "ell":
        a, b = r * 0.8, r * 0.32
        pts = [(-a, -a), (-a + 2 * b, -a), (-a + 2 * b, a - 2 * b), (a, a - 2 * b), (a, a), (-a, a)]
        d.polygon(_rotated(pts, rot, cx, cy), fill=fill)
    else:  # pragma: no cover
        raise ValueError(name)


def _hsv_rgb(h: float, s: float, v: float) -> tuple[int, int, int]:
    i = int(h * 6) % 6
    f = h * 6 - int(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    r, g, b = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]
    return int(r * 255), int(g * 255), int(b * 255)


def render(seed: int, split: str, index: int, size: int = 64) -> tuple[Image.Image, int, int]:
    """Image ``index`` of ``split``: (RGB image, class, JPEG quality). Classes cycle with the index."""
    cls = index % len(CLASSES)
    rng = np.random.default_rng([seed, _SPLIT_ID[split], index])
    S = size * _SS
    # Background: two random colours blended by a linear gradient in a random direction.
    h0 = rng.random()
    bg0 = np.array(_hsv_rgb(h0, rng.uniform(0.1, 0.7), rng.uniform(0.2, 0.95)), np.float32)
    bg1 = np.array(
        _hsv_rgb((h0 + rng.uniform(-0.2, 0.2)) % 1, rng.uniform(0.1, 0.7), rng.uniform(0.2, 0.95)), np.float32
    )
    ang = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)
    t = np.clip(((xx - 0.5) * math.cos(ang) + (yy - 0.5) * math.sin(ang)) + 0.5, 0, 1)[..., None]
    bg = (bg0 * (1 - t) + bg1 * t).astype(np.uint8)
    img = Image.fromarray(bg).resize((S, S), Image.BILINEAR)  # type: ignore[attr-defined]  # Pillow sets its constants at run time; its stubs have Image.Resampling (9.1+)
    d = ImageDraw.Draw(img)
    # Clutter: thin lines and dots of random colours, none of them a class shape.
    for _ in range(int(rng.integers(0, 3))):
        col = _hsv_rgb(rng.random(), rng.uniform(0, 1), rng.uniform(0.1, 1))
        x0, y0, x1, y1 = rng.uniform(0, S, 4)
        d.line([(x0, y0), (x1, y1)], fill=col, width=_SS)
    for _ in range(int(rng.integers(1, 5))):
        col = _hsv_rgb(rng.random(), rng.uniform(0, 1), rng.uniform(0.1, 1))
        x, y, rr = rng.uniform(0, S), rng.uniform(0, S), rng.uniform(0.5, 2.0) * _SS
        d.ellipse([x - rr, y - rr, x + rr, y + rr], fill=col)
    # The shape: a colour that differs from the local background in value, so it is always visible.
    r = rng.uniform(0.33, 0.45) * S
    margin = r
    cx, cy = rng.uniform(margin, S - margin), rng.uniform(margin, S - margin)
    rot = rng.uniform(0, 2 * math.pi)
    local = bg[min(size - 1, int(cy / _SS)), min(size - 1, int(cx / _SS))].astype(float) / 255
    lv = float(local.max())
    v = rng.uniform(0.55, 1.0) if lv < 0.55 else rng.uniform(0.0, max(0.05, lv - 0.45))
    fill = _hsv_rgb(rng.random(), rng.uniform(0.2, 1.0), v)
    hole = tuple(int(c) for c in bg[min(size - 1, int(cy / _SS)), min(size - 1, int(cx / _SS))])
    _draw_shape(d, cls, cx, cy, r, rot, fill, hole)
    img = img.resize((size, size), Image.LANCZOS)  # type: ignore[attr-defined]  # Pillow sets its constants at run time; its stubs have Image.Resampling (9.1+)
    if rng.random() < 0.1:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.6)))
    arr = np.asarray(img).astype(np.float32)
    arr += rng.normal(0, rng.uniform(2, 6), arr.shape).astype(np.float32)
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    return img, cls, int(rng.integers(70, 96))


def class_dir(cls: int) -> str:
    return f"{cls:02d}_{CLASSES[cls]}"


def _write_range(args: tuple) -> int:
    out, seed, split, start, stop, size = args
    for i in range(start, stop):
        img, cls, q = render(seed, split, i, size)
        img.save(Path(out) / split / class_dir(cls) / f"{i:05d}.JPEG", quality=q)
    return stop - start


def generate(
    out: str | os.PathLike,
    seed: int = 0,
    train_per_class: int = 1000,
    val_per_class: int = 100,
    size: int = 64,
    workers: int = 2,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write the demo set into ``out`` (which must not hold a finished set); return its manifest."""
    out = Path(out)
    for name, v in (("--train-per-class", train_per_class), ("--val-per-class", val_per_class)):
        if v < 1:
            raise UserError(f"{name}: {v} must be at least 1")
    if not 16 <= size <= 1024:
        raise UserError(f"--size: {size} must be between 16 and 1024 pixels")
    n = {"train": train_per_class * len(CLASSES), "val": val_per_class * len(CLASSES)}
    try:
        for split in n:
            for c in range(len(CLASSES)):
                (out / split / class_dir(c)).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot create the data set folder ({e.strerror})") from None
    t0 = time.time()
    chunk = 250
    jobs = [
        (str(out), seed, split, s, min(s + chunk, n[split]), size) for split in n for s in range(0, n[split], chunk)
    ]
    total, done = sum(n.values()), 0
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            for k in pool.map(_write_range, jobs):
                done += k
                if progress:
                    progress(done, total)
    else:
        for j in jobs:
            done += _write_range(j)
            if progress:
                progress(done, total)
    manifest = {
        "version": VERSION,
        "seed": seed,
        "size": size,
        "classes": [class_dir(c) for c in range(10)],
        "train": n["train"],
        "val": n["val"],
        "seconds": round(time.time() - t0, 2),
    }
    (out / "demo.json").write_text(json.dumps(manifest, indent=1) + "\n")  # the completion marker, last
    return manifest


def read_manifest(path: str | os.PathLike) -> dict | None:
    """The manifest of a finished demo set at ``path``, or None."""
    try:  # through the door: a FIFO put at demo.json is refused unopened, and reads as no manifest
        manifest = read_json(Path(path) / "demo.json", "demo set", 1 << 20)
    except UserError:
        return None
    return manifest if isinstance(manifest, dict) else None


def ensure_demo_dataset(
    path: str | os.PathLike | None = None,
    seed: int = 0,
    *,
    train_per_class: int = 1000,
    val_per_class: int = 100,
    size: int = 64,
    workers: int = 2,
    log: Callable[[str], None] | None = print,
) -> Path:
    """Return ``path`` (default: the cache folder) holding the demo set, generating it first if missing.

    Generation goes to a temporary sibling folder that is renamed into place when complete, so concurrent
    callers and interrupted runs never see a half-written set.
    """
    path = Path(path) if path is not None else default_cache_dir()
    m = read_manifest(path)
    want = {
        "version": VERSION,
        "seed": seed,
        "size": size,
        "train": train_per_class * len(CLASSES),
        "val": val_per_class * len(CLASSES),
    }
    if m is not None and all(m.get(k) == v for k, v in want.items()):
        return path
    if m is not None:
        raise UserError(
            f"{path}: holds a demo set made with other settings "
            f"({', '.join(f'{k}={m.get(k)}' for k in want)}); remove it or choose another folder"
        )
    if path.exists() and any(path.iterdir()):
        raise UserError(f"{path}: exists, is not empty and holds no finished demo set (no demo.json)")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if log:
        log(f"generating the demo data set in {path} (seed {seed}) ...")
    m = generate(tmp, seed, train_per_class, val_per_class, size, workers)
    try:
        if path.exists():
            path.rmdir()
        tmp.rename(path)
    except OSError:
        # Another process finished first: keep its copy if it is complete.
        shutil.rmtree(tmp, ignore_errors=True)
        if read_manifest(path) is None:
            raise
    if log:
        log(f"demo data set ready: {m['train']} train + {m['val']} val images, {m['seconds']} s")
    return path


# --------------------------------------------------------------------------------------------------------
# the demo data source (its entry is ``demo`` in job/sources.py): the set in the cache, read as a folder
# --------------------------------------------------------------------------------------------------------
def open_loader(request: LoaderRequest):
    """The loader of the demo set in the cache (generated there when missing), read as a folder."""
    return folder.open_loader(replace(request, root=str(ensure_demo_dataset(seed=0, log=None))))


def classes(spec) -> tuple[str, dict]:
    """The preflight's view: the ten class folders, in both splits (known without generating the set)."""
    names = tuple(class_dir(c) for c in range(len(CLASSES)))
    return "the demo data set", dict.fromkeys(_SPLIT_ID, names)


def prepare(spec, log=None) -> None:
    """Before any rank starts: the set generated into the cache (when missing) and its index built; the ranks
    are handed the index's place in spec.data.index."""
    root = ensure_demo_dataset(seed=0, log=log)
    spec.data.index = str(ensure_index(root, spec.data.index or None, log=log))
