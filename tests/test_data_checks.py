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


def pil_reads(data: bytes) -> bool:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    except Exception:
        return False
    return True


@pytest.mark.parametrize("kind", ["baseline", "progressive", "grayscale", "cmyk", "png_rgba", "webp", "bmp"])
def test_the_cheap_check_is_pil_s_verdict_on_every_cut(kind):
    """The file cut at every length: the cheap check refuses exactly the cuts PIL cannot decode (never a
    readable one: a grayscale JPEG missing its end marker, a PNG missing its last checksum still read)."""
    data = samples()[kind].data
    step = max(1, len(data) // 400)
    for cut in [*range(1, len(data), step), *range(len(data) - 24, len(data))]:
        part = data[:cut]
        problem = content_problem(part)
        assert (problem is None) == pil_reads(part), (cut, problem)
        if problem is not None and cut > 20:
            assert problem.kind == "truncated" and decode_problem(part).kind == "truncated", (cut, problem)


def test_a_bmp_with_a_wrong_file_size_in_its_header_passes():
    data = samples()["bmp"].data
    wrong = data[:2] + (len(data) + 100).to_bytes(4, "little") + data[6:]
    assert content_problem(wrong) is None and decode_problem(wrong) is None


def test_a_thumbnail_end_marker_does_not_hide_a_truncated_jpeg():
    """An Exif thumbnail is a whole JPEG inside APP1; its end marker is skipped with its segment, so the image
    cut after its first scan is still truncated."""
    from PIL import Image

    thumb = samples()["baseline"].data
    app1 = b"\xff\xe1" + (len(thumb) + 8).to_bytes(2, "big") + b"Exif\0\0" + thumb
    big = io.BytesIO()
    Image.effect_noise((64, 64), 40).convert("RGB").save(big, "JPEG")
    whole = big.getvalue()[:2] + app1 + big.getvalue()[2:]
    assert content_problem(whole) is None and decode_problem(whole) is None
    cut = whole[: len(whole) - 200]  # inside the image's scan, after the thumbnail's end marker
    assert b"\xff\xd9" in cut and content_problem(cut).kind == "truncated"
    assert content_problem(cut + b"\0" * 40).kind == "truncated"


def test_checks_module_is_pure():
    code = "import sys, torus_train.data.checks, torus_train.data.index, torus_train.data.sharding, torus_train.data; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
