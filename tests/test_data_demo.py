"""The demo data set: deterministic real JPEGs in ImageNet layout, the cache helper, and `data demo`."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from torus_train.data.checks import scan
from torus_train.data.demo import CLASSES, ensure_demo_dataset, generate, read_manifest, render
from torus_train.errors import UserError


def digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.JPEG")):
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def test_deterministic_from_seed(tmp_path):
    a = generate(tmp_path / "a", seed=7, train_per_class=3, val_per_class=2, workers=1)
    generate(tmp_path / "b", seed=7, train_per_class=3, val_per_class=2, workers=2)
    generate(tmp_path / "c", seed=8, train_per_class=3, val_per_class=2, workers=1)
    assert digest(tmp_path / "a") == digest(tmp_path / "b") != digest(tmp_path / "c")
    assert (a["train"], a["val"]) == (30, 20)
    s = scan(tmp_path / "a", "train")
    assert len(s.classes) == len(CLASSES) == 10 and len(s) == 30
    assert scan(tmp_path / "a", "val").classes == s.classes


def test_images_are_real_varied_jpegs(tmp_path):
    generate(tmp_path, seed=0, train_per_class=4, val_per_class=1, size=64, workers=1)
    files = sorted((tmp_path / "train").rglob("*.JPEG"))
    arrays = []
    for p in files:
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.size == (64, 64)
            arrays.append(np.asarray(im.convert("RGB"), np.float32))
    stack = np.stack(arrays)
    # no two images alike; the mean colour varies a lot across images (random colours and backgrounds)
    assert len({a.tobytes() for a in arrays}) == len(arrays)
    assert stack.mean(axis=(1, 2)).std(axis=0).min() > 10


def test_same_class_differs_in_position_and_scale():
    imgs = [np.asarray(render(0, "train", i * 10)[0], np.float32) for i in range(6)]  # all class 0
    assert all(render(0, "train", i * 10)[1] == 0 for i in range(6))
    pair_diffs = [np.abs(imgs[i] - imgs[i + 1]).mean() for i in range(5)]
    assert min(pair_diffs) > 10


def test_ensure_creates_once_and_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv("TORUS_TRAIN_CACHE", str(tmp_path / "cache"))
    msgs = []
    p = ensure_demo_dataset(train_per_class=2, val_per_class=1, log=msgs.append)
    assert p == tmp_path / "cache" / p.name and p.name.startswith("demo-v")
    assert read_manifest(p)["train"] == 20 and len(msgs) == 2
    stamp = (p / "demo.json").stat().st_mtime_ns
    assert ensure_demo_dataset(train_per_class=2, val_per_class=1, log=msgs.append) == p
    assert (p / "demo.json").stat().st_mtime_ns == stamp and len(msgs) == 2
    with pytest.raises(UserError, match="holds a demo set made with other settings"):
        ensure_demo_dataset(train_per_class=3, val_per_class=1, log=None)
    assert not list(p.parent.glob(".*tmp*"))


def test_cli_data_demo(tmp_path):
    out = tmp_path / "d"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torus_train",
            "data",
            "demo",
            "--out",
            str(out),
            "--seed",
            "3",
            "--train-per-class",
            "2",
            "--val-per-class",
            "1",
            "--size",
            "32",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "train 20 images, val 10 images, 32x32 JPEG" in r.stdout
    assert "100.0%" in r.stderr
    assert json.loads((out / "demo.json").read_text())["seed"] == 3
    again = subprocess.run(
        [sys.executable, "-m", "torus_train", "data", "demo", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert "already holds a demo data set" in again.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "torus_train", "data", "demo", "--out", str(tmp_path / "e"), "--size", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--size: 8" in bad.stderr


def test_cli_data_check_names_the_bad_path(tmp_path):
    generate(tmp_path, seed=0, train_per_class=1, val_per_class=1, size=32, workers=1)
    (tmp_path / "train" / "03_square" / "readme.md").write_text("x")
    r = subprocess.run(
        [sys.executable, "-m", "torus_train", "data", "check", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "03_square/readme.md: not an image file" in r.stderr
