#!/usr/bin/env python3
"""Pack one synthetic ImageNet in each layout it ships in and compare: time, peak disk, and the packed sets.

    python scripts/bench/pack_layouts.py [--classes 100] [--per-class 20] [--val-per-class 5] [--work DIR]

The same images are written three ways (`make_layouts`): an ImageNet-layout folder; image-net.org's archives
(ILSVRC2012_img_train.tar of per-class tars, ILSVRC2012_img_val.tar, ILSVRC2012_devkit_t12.tar.gz with the
validation ground truth and a meta.mat in the real one's structure, its ILSVRC2012_IDs not in WNID order); and
Kaggle's layout (ILSVRC/Data/CLS-LOC/{train,val,test}, LOC_val_solution.csv, LOC_synset_mapping.txt). Each is
packed by `torus-train data pack` in a subprocess (`measure_pack`) while the bytes on disk under the output's
folder and the pack's TMPDIR are polled, and every file the pack opens for writing is recorded (an audit hook),
so an extracted member would show. Prints a table: seconds, packed MB, peak MB, peak / packed, and whether the
packed index and shards equal the folder's. Exit 1 when a layout's set differs from the folder's.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
ODD_KINDS = ("baseline", "progressive", "grayscale", "cmyk", "yuv444")
"""samples.py's JPEG kinds put among the images (class 0's first files), so the layouts carry the oddities too."""


def wnid(c: int) -> str:
    return f"n{1440764 + 7919 * c:08d}"


def _jpeg(k: int, size: int) -> bytes:
    """A distinct small JPEG for image number k: its colour and a band position encode k."""
    a = np.full((size, size + 8, 3), ((k * 37) % 256, (k * 91) % 256, (k // 256 * 53) % 256), np.uint8)
    a[:, k % size] = 255 - a[:, k % size]
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def make_images(classes: int, per_class: int, val_per_class: int, size: int = 24, seed: int = 0) -> dict:
    """{"train": {wnid: {name: bytes}}, "val": {number: (wnid, bytes)}, "words": {wnid: words}}. Validation
    numbers are dealt out at random across the classes, as ImageNet's are."""
    from torus_train.data.samples import samples

    odd = [samples()[k].data for k in ODD_KINDS]
    rng, k = random.Random(seed), 0
    train: dict[str, dict[str, bytes]] = {}
    for c in range(classes):
        train[wnid(c)] = {}
        for j in range(per_class):
            data = odd.pop(0) if c == 0 and odd else _jpeg(k, size)
            train[wnid(c)][f"{wnid(c)}_{1000 + 13 * j}.JPEG"] = data
            k += 1
    owners = [wnid(c) for c in range(classes) for _ in range(val_per_class)]
    rng.shuffle(owners)
    val = {n: (w, _jpeg(k + n, size)) for n, w in enumerate(owners, 1)}
    words = {wnid(c): f"class {c} words, synonym {c}" for c in range(classes)}
    return {"train": train, "val": val, "words": words}


def val_name(n: int) -> str:
    return f"ILSVRC2012_val_{n:08d}.JPEG"


def write_folder_layout(images: dict, root: Path) -> Path:
    for w, files in images["train"].items():
        (root / "train" / w).mkdir(parents=True)
        for name, data in files.items():
            (root / "train" / w / name).write_bytes(data)
    for n, (w, data) in images["val"].items():
        (root / "val" / w).mkdir(parents=True, exist_ok=True)
        (root / "val" / w / val_name(n)).write_bytes(data)
    return root


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 1_336_000_000
    tf.addfile(info, io.BytesIO(data))


def meta_mat(words: dict, ids: dict) -> bytes:
    """A meta.mat in the devkit's structure: a struct array 'synsets' (N x 1) with the devkit's eight fields;
    the leaves (num_children 0) are the classes, plus two inner WordNet nodes as the real file has."""
    from scipy.io import savemat

    fields = [
        ("ILSVRC2012_ID", "O"),
        ("WNID", "O"),
        ("words", "O"),
        ("gloss", "O"),
        ("num_children", "O"),
        ("children", "O"),
        ("wordnet_height", "O"),
        ("num_train_images", "O"),
    ]
    rows: list[tuple] = [
        (ids[w], w, words[w], f"gloss of {w}", 0, np.zeros((1, 0)), 0, 1300) for w in sorted(ids, key=lambda w: ids[w])
    ]
    n = len(rows)
    rows += [
        (n + 1, "n00001740", "entity", "that which exists", 1, np.array([[n + 2]]), 19, 0),
        (n + 2, "n00002684", "object, physical object", "a tangible thing", n, np.arange(1, n + 1)[None], 18, 0),
    ]
    synsets = np.zeros((len(rows), 1), dtype=fields)
    for i, r in enumerate(rows):
        synsets[i, 0] = r
    buf = io.BytesIO()
    savemat(buf, {"synsets": synsets})
    return buf.getvalue()


def write_archives(images: dict, root: Path, seed: int = 0) -> Path:
    """image-net.org's three files. The ILSVRC2012_IDs are a shuffle of 1..N (the real ones are not in WNID
    order either) and the validation tar holds its images out of number order: labels must come from the
    ground truth and the names, not from any order."""
    rng = random.Random(seed + 1)
    root.mkdir(parents=True)
    wnids = sorted(images["train"])
    order = list(range(1, len(wnids) + 1))
    rng.shuffle(order)
    ids = dict(zip(wnids, order, strict=True))
    with tarfile.open(root / "ILSVRC2012_img_train.tar", "w", format=tarfile.GNU_FORMAT) as outer:
        for w in rng.sample(wnids, len(wnids)):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w", format=tarfile.GNU_FORMAT) as t:
                for name, data in rng.sample(sorted(images["train"][w].items()), len(images["train"][w])):
                    _add(t, name, data)
            _add(outer, f"{w}.tar", inner.getvalue())
    numbers = sorted(images["val"])
    with tarfile.open(root / "ILSVRC2012_img_val.tar", "w", format=tarfile.GNU_FORMAT) as t:
        for n in rng.sample(numbers, len(numbers)):
            _add(t, val_name(n), images["val"][n][1])
    truth = "".join(f"{ids[images['val'][n][0]]}\n" for n in numbers).encode()
    with tarfile.open(root / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as t:
        _add(t, "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt", truth)
        _add(t, "ILSVRC2012_devkit_t12/data/meta.mat", meta_mat(images["words"], ids))
        _add(t, "ILSVRC2012_devkit_t12/readme.txt", b"ILSVRC2012 development kit (synthetic)\n")
    return root


def write_kaggle(images: dict, root: Path) -> Path:
    """Kaggle's download: CLS-LOC train/WNID/, a flat val/, a test/ without labels, the CSV and the mapping."""
    data = root / "ILSVRC/Data/CLS-LOC"
    for w, files in images["train"].items():
        (data / "train" / w).mkdir(parents=True)
        for name, content in files.items():
            (data / "train" / w / name).write_bytes(content)
    (data / "val").mkdir()
    (data / "test").mkdir()
    rows = ["ImageId,PredictionString"]
    for n, (w, content) in images["val"].items():
        (data / "val" / val_name(n)).write_bytes(content)
        rows.append(f"{val_name(n)[:-5]},{w} 12 7 40 30 {w} 3 2 20 21")
    (data / "test" / "ILSVRC2012_test_00000001.JPEG").write_bytes(_jpeg(999_999, 24))
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    (root / "LOC_synset_mapping.txt").write_text("".join(f"{w} {t}\n" for w, t in sorted(images["words"].items())))
    (root / "LOC_sample_submission.csv").write_text("ImageId,PredictionString\n")
    return root


def make_layouts(work: Path, classes: int, per_class: int, val_per_class: int, size: int = 24) -> dict[str, Path]:
    """The same images in the three layouts under ``work``: {"folder": ..., "archives": ..., "kaggle": ...}."""
    images = make_images(classes, per_class, val_per_class, size)
    return {
        "folder": write_folder_layout(images, work / "folder"),
        "archives": write_archives(images, work / "archives"),
        "kaggle": write_kaggle(images, work / "kaggle"),
    }


_HOOK = """
import os, sys
written = []
def hook(event, args):
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1], args[2]
        if (mode and any(c in mode for c in "wax+")) or (mode is None and flags & (os.O_WRONLY | os.O_RDWR)):
            written.append(os.fsdecode(args[0]))
sys.addaudithook(hook)
import atexit
def report():
    text = "\\n".join(written)
    with open(os.environ["PACK_WRITTEN"], "w") as f:
        f.write(text)
atexit.register(report)
from torus_train.cli import main
main(sys.argv[1:])
"""


def _bytes_under(folders: list[Path]) -> int:
    total = 0
    for folder in folders:
        for dirpath, _, files in os.walk(folder):
            for f in files:
                with contextlib.suppress(OSError):  # a file renamed or removed while we walk
                    total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def measure_pack(data: Path, out: Path, shard_mb: float = 1.0, interval: float = 0.002) -> dict:
    """`torus-train data pack --data DATA --out OUT` in a subprocess, TMPDIR inside OUT's parent's scratch folder;
    the peak of the bytes under OUT's parent folder and that TMPDIR while it runs (polled every ``interval``
    seconds; both start empty), the packed set's size (the sum of its files) and every file it opened to write."""
    scratch = out.parent / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    watched = [out.parent]
    base = _bytes_under(watched)
    record = Path(tempfile.mkdtemp()) / "written.txt"  # outside the watched folders
    env = {
        **os.environ,
        "TMPDIR": str(scratch),
        "PACK_WRITTEN": str(record),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    cmd = [sys.executable, "-c", _HOOK, "data", "pack", "--data", str(data), "--out", str(out)]
    cmd += ["--shard-mb", str(shard_mb)]
    peak, done = [0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _bytes_under(watched) - base)
            time.sleep(interval)

    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    out_text, err_text = proc.communicate()
    seconds = time.time() - t0
    done.set()
    watcher.join()
    peak[0] = max(peak[0], _bytes_under(watched) - base)
    written = record.read_text().split("\n") if record.exists() else []
    shutil.rmtree(record.parent, ignore_errors=True)
    packed = _bytes_under([out]) if out.is_dir() else 0
    return {
        "rc": proc.returncode,
        "stdout": out_text,
        "stderr": err_text,
        "seconds": seconds,
        "peak_bytes": peak[0],
        "packed_bytes": packed,
        "written": [w for w in written if w],
    }


def packed_digest(path: Path) -> dict:
    """What must be equal between two packings of the same images: the index arrays, the classes and counts,
    every shard's SHA-256 (packed.json's fields that name the source, its layout and the time are left out)."""
    meta = json.loads((path / "packed.json").read_text())
    arrays = {f.name: hashlib.sha256(np.load(f).tobytes()).hexdigest() for f in sorted(path.glob("*.npy"))}
    splits = {
        s: {"classes": m["classes"], "count": m["count"], "shards": [(sh["name"], sh["sha256"]) for sh in m["shards"]]}
        for s, m in meta["splits"].items()
    }
    return {"arrays": arrays, "splits": splits, "checksum": meta["checksum"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=20)
    ap.add_argument("--val-per-class", type=int, default=5)
    ap.add_argument("--size", type=int, default=64, help="image side in pixels")
    ap.add_argument("--shard-mb", type=float, default=1.0)
    ap.add_argument("--work", type=Path, default=None, help="folder for the data and packed sets (default: a temp)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or Path(tmp)
        t0 = time.time()
        layouts = make_layouts(work / "data", a.classes, a.per_class, a.val_per_class, a.size)
        print(
            f"{a.classes} classes x {a.per_class} train + {a.val_per_class} val images ({a.size} px), three layouts "
            f"written in {time.time() - t0:.1f} s"
        )
        print(f"{'layout':<9} {'seconds':>8} {'packed MB':>10} {'peak MB':>8} {'peak/packed':>11}  same as folder")
        reference, differ = None, False
        for name, data in layouts.items():
            r = measure_pack(data, work / f"packed-{name}" / "P", a.shard_mb)
            if r["rc"] != 0:
                print(f"{name}: pack failed ({r['rc']}): {r['stderr'].strip()}")
                return 1
            digest = packed_digest(work / f"packed-{name}" / "P")
            reference = reference or digest
            same = digest == reference
            differ |= not same
            print(
                f"{name:<9} {r['seconds']:>8.2f} {r['packed_bytes'] / 1e6:>10.2f} {r['peak_bytes'] / 1e6:>8.2f} "
                f"{r['peak_bytes'] / r['packed_bytes']:>11.3f}  {'yes' if same else 'NO'}"
            )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
