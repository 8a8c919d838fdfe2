"""Data-folder validation: errors name the path."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys

import numpy as np
import pytest
from datahelp import make_index_set

from torus_train.data.checks import DataError, content_problem, decode_problem, scan
from torus_train.data.samples import cpu_only_samples, samples


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


def test_a_file_is_judged_by_its_content_not_its_name(folder):
    victim = folder / "train" / "c2" / "0002.JPEG"
    data = victim.read_bytes()
    victim.write_bytes(data[:-10])
    with pytest.raises(DataError, match=r"c2/0002\.JPEG: truncated JPEG \(no end-of-image marker after its last scan"):
        scan(folder, "train")
    assert len(scan(folder, "train", verify=False)) == 30
    victim.write_bytes(data + b"\0" * 5 + b"bytes after the end marker")  # decoders stop at the marker
    assert len(scan(folder, "train")) == 30
    victim.write_bytes(samples()["png_named_jpeg"].data)  # a PNG named .JPEG is a readable PNG
    assert len(scan(folder, "train")) == 30
    victim.write_bytes(b"<html><body>404 Not Found</body></html>")
    with pytest.raises(DataError, match=r"c2/0002\.JPEG: not an image \(no image format starts with b'<html><b'\)"):
        scan(folder, "train")
    victim.write_bytes(b"")
    with pytest.raises(DataError, match=r"c2/0002\.JPEG: empty file"):
        scan(folder, "train")


@pytest.mark.parametrize("kind", [*samples(), *cpu_only_samples()])
def test_every_kind_a_decoder_reads_passes_both_checks(kind):
    data = {**samples(), **cpu_only_samples()}[kind].data
    assert content_problem(data) is None and decode_problem(data) is None
    assert content_problem(np.frombuffer(data, np.uint8)) is None  # as the readers hold it


@pytest.mark.parametrize("kind", ["baseline", "progressive", "cmyk", "png_rgba", "webp", "bmp"])
def test_a_cut_file_is_truncated_by_either_check(kind):
    data = samples()[kind].data
    for cut in (len(data) // 2, len(data) - 10):  # 10: into a PNG's IEND chunk (a lost IEND CRC still reads)
        assert content_problem(data[:cut]).kind == "truncated", cut
        assert decode_problem(data[:cut]).kind == "truncated", cut


def test_a_thumbnail_end_marker_does_not_hide_a_truncated_jpeg():
    """An Exif thumbnail is a whole JPEG inside APP1; its end marker is skipped with its segment, so the image
    cut after its first scan is still truncated."""
    from PIL import Image

    thumb = samples()["baseline"].data
    app1 = b"\xff\xe1" + (len(thumb) + 8).to_bytes(2, "big") + b"Exif\0\0" + thumb
    big = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(big, "JPEG")
    whole = big.getvalue()[:2] + app1 + big.getvalue()[2:]
    assert content_problem(whole) is None and decode_problem(whole) is None
    assert content_problem(whole[:-2]).kind == "truncated"
    assert content_problem(whole[:-2] + b"\0" * 40) is not None


def test_checks_module_is_pure():
    code = "import sys, torus_train.data.checks, torus_train.data.index, torus_train.data.sharding, torus_train.data; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
