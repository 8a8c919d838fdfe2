"""Data-folder validation: errors name the path."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from datahelp import make_index_set

from torus_train.data.checks import DataError, scan


@pytest.fixture()
def folder(tmp_path):
    return make_index_set(tmp_path / "d", n_train=30, n_val=9)


def test_scan_lists_sorted_classes_and_files(folder):
    s = scan(folder, "train")
    assert s.classes == ("c0", "c1", "c2") and len(s) == 30
    assert list(s.labels) == sorted(s.labels)
    assert s.files[0].endswith("c0/0000.JPEG")


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path / 'nope'}: data folder not found"):
        scan(tmp_path / "nope", "train")


def test_missing_split(folder):
    shutil.rmtree(folder / "val")
    with pytest.raises(DataError, match=r"/val: missing"):
        scan(folder, "val")


def test_empty_class_folder(folder):
    (folder / "train" / "c9").mkdir()
    with pytest.raises(DataError, match=r"train/c9: empty class folder"):
        scan(folder, "train")


def test_non_image_file(folder):
    (folder / "train" / "c1" / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match=r"train/c1/notes\.txt: not an image file"):
        scan(folder, "train")
    (folder / "train" / "c1" / "notes.txt").unlink()
    (folder / "train" / "c1" / ".DS_Store").write_text("x")  # hidden files are ignored
    assert len(scan(folder, "train")) == 30


def test_truncated_and_fake_jpeg(folder):
    victim = folder / "train" / "c2" / "0002.JPEG"
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"c2/0002\.JPEG: corrupt JPEG \(truncated"):
        scan(folder, "train")
    assert len(scan(folder, "train", verify=False)) == 30
    victim.write_bytes(b"GIF89a" + data)
    with pytest.raises(DataError, match=r"c2/0002\.JPEG: not a JPEG file"):
        scan(folder, "train")


def test_checks_module_is_pure():
    code = "import sys, torus_train.data.checks, torus_train.data.index, torus_train.data.sharding, torus_train.data; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
