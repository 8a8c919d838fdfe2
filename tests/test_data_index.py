"""The file index: built once by directory reads, reused, refused when stale, foreign, damaged or of another
version, each with one line that says how to rebuild it; `data index` and `data check` from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from datahelp import make_index_set

from torus_train.data.checks import scan
from torus_train.data.index import DataError, build_index, ensure_index, load_index


@pytest.fixture()
def folder(tmp_path):
    return make_index_set(tmp_path / "d", n_train=30, n_val=9)


def test_index_lists_what_a_scan_lists(folder):
    dest = build_index(folder)
    assert dest == folder / ".torus-train-index"
    idx = load_index(dest, folder)
    for split in ("train", "val"):
        s, scanned = idx.split(split), scan(folder, split)
        assert s.classes == scanned.classes and list(s.files) == list(scanned.files)
        assert list(s.labels) == list(scanned.labels)
    assert idx.meta["splits"]["train"]["count"] == 30


def test_ensure_reuses_a_good_index_and_builds_a_missing_one(folder):
    dest = ensure_index(folder)
    built = (dest / "meta.json").stat().st_mtime_ns
    assert ensure_index(folder) == dest and (dest / "meta.json").stat().st_mtime_ns == built


def test_stale_index_is_refused(folder):
    build_index(folder)
    (folder / "train" / "c1" / "0001.JPEG").unlink()
    with pytest.raises(DataError, match=r"index is stale .*train changed.*torus-train data index --data"):
        ensure_index(folder)


def test_foreign_index_is_refused(folder, tmp_path):
    other = make_index_set(tmp_path / "other", n_train=6, n_val=3)
    dest = build_index(other)
    with pytest.raises(DataError, match=r"built for .*other, not .*d;"):
        load_index(dest, folder)


@pytest.mark.parametrize(
    "damage, match",
    [
        ("checksum", r"damaged \(checksum differs\)"),
        ("truncate", r"not a readable index|damaged"),
        ("version", r"index version 99 is not 1"),
        ("missing", r"no index there"),
    ],
)
def test_damaged_index_is_refused(folder, damage, match):
    dest = build_index(folder)
    labels = dest / "train.labels.npy"
    if damage == "checksum":
        a = np.load(labels)
        a[0] = 2
        np.save(labels, a)
    elif damage == "truncate":
        labels.write_bytes(labels.read_bytes()[:100])
    elif damage == "version":
        meta = json.loads((dest / "meta.json").read_text())
        meta["version"] = 99
        (dest / "meta.json").write_text(json.dumps(meta))
    else:
        (dest / "meta.json").unlink()
        os.rename(dest, dest.with_name("gone"))
    with pytest.raises(DataError, match=match):
        load_index(dest, folder).verify_checksum()


def test_read_only_data_folder_indexes_into_the_cache(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("TORUS_TRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "access", lambda p, mode: False)
    dest = build_index(folder)
    assert str(dest).startswith(str(tmp_path / "cache" / "index"))
    assert load_index(dest, folder).split("val").classes == ("c0", "c1", "c2")


def test_cli_index_and_check(folder):
    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "torus_train", "data", *args], capture_output=True, text=True, timeout=120
        )

    r = cli("index", "--data", str(folder))
    assert r.returncode == 0 and "train: 3 classes, 30 files" in r.stdout, r.stderr
    r = cli("check", "--data", str(folder))
    assert r.returncode == 0 and "index matches the folder" in r.stdout, r.stderr
    os.unlink(folder / "val" / "c2" / "0002.JPEG")
    r = cli("check", "--data", str(folder))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "val: 8 files in the folder, 9 indexed; gone: c2/0002.JPEG" in r.stderr
