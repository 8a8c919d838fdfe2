"""`data pack` meets what a fuzzer puts in a data set (issue 45): every file of every layout opened through the door
(torus_train/userfiles.py), so a FIFO where an image, a label file, an archive or the devkit belongs is refused by
name, never opened to block; a ground-truth line that is not an ASCII number, and a set whose validation split is
empty, are refused too. Each case: `torus-train data pack` in a subprocess with a time limit (a block fails the test
instead of hanging it), one line, exit 2, and nothing left behind: no packed set, no `.out.partial-PID` folder, the
data set unchanged. The inputs are made in tmp_path, outside the project."""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from clihelp import tree_digest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench" / "pack_layouts.py"
LIMIT_S = 120
"""A pack of these few images takes about a second; one that blocks on a FIFO is killed here and fails."""
VAL = "ILSVRC/Data/CLS-LOC/val"
DEVKIT = "ILSVRC2012_devkit_t12"
TRUTH = f"{DEVKIT}/data/ILSVRC2012_validation_ground_truth.txt"


def _bench():
    spec = importlib.util.spec_from_file_location("pack_layouts_bench_door", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    work = tmp_path_factory.mktemp("door-layouts")
    images = bench.make_images(3, 3, 2)
    return {
        "folder": bench.write_folder_layout(images, work / "folder"),
        "archives": bench.write_archives(images, work / "archives"),
        "kaggle": bench.write_kaggle(images, work / "kaggle"),
    }


def env() -> dict:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def pack(data: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torus_train", "data", "pack", "--data", str(data), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        env=env(),
    )


def fifo(path: Path) -> None:
    """``path`` (a file or absent) becomes a FIFO that no one writes: opening it to read blocks forever."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def extract_devkit(data: Path) -> None:
    """The devkit as its extracted folder, the tar.gz gone (the layout reads either)."""
    with tarfile.open(data / f"{DEVKIT}.tar.gz") as t:
        t.extractall(data, filter="data")
    (data / f"{DEVKIT}.tar.gz").unlink()


def rewrite_truth(data: Path, change) -> None:
    """The ground truth's lines passed through change(lines), in the devkit's tar.gz."""
    path = data / f"{DEVKIT}.tar.gz"
    with tarfile.open(path) as t:
        members = [(m.name, t.extractfile(m).read()) for m in t if m.isfile()]
    with tarfile.open(path, "w:gz") as t:
        for name, raw in members:
            if name == TRUTH:
                raw = "".join(f"{line}\n" for line in change(raw.decode().splitlines())).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            t.addfile(info, io.BytesIO(raw))


def empty_archive_val(data: Path) -> None:
    with tarfile.open(data / "ILSVRC2012_img_val.tar", "w"):
        pass
    rewrite_truth(data, lambda lines: [])


def empty_kaggle_val(data: Path) -> None:
    for f in (data / VAL).iterdir():
        f.unlink()
    header = (data / "LOC_val_solution.csv").read_text().splitlines()[0]
    (data / "LOC_val_solution.csv").write_text(header + "\n")


# (case, layout, how the copy is spoilt, the words the one line holds: a text, or texts; a long path is shown cut in
# the middle, its last 30 characters kept)
CASES = [
    ("kaggle val image", "kaggle", lambda d: fifo(d / VAL / "ILSVRC2012_val_00000001.JPEG"),
     "ILSVRC2012_val_00000001.JPEG: not a regular file (a broken link, a FIFO or a device), not an image"),
    ("kaggle train image", "kaggle", lambda d: fifo(next((d / "ILSVRC/Data/CLS-LOC/train").glob("*/*.JPEG"))),
     "not a regular file (a broken link, a FIFO or a device), not an image"),
    ("LOC_val_solution.csv", "kaggle", lambda d: fifo(d / "LOC_val_solution.csv"),
     ("LOC_val_solution.csv (", "is a FIFO, not a regular file")),
    ("LOC_synset_mapping.txt", "kaggle", lambda d: fifo(d / "LOC_synset_mapping.txt"),
     ("LOC_synset_mapping.txt (", "is a FIFO, not a regular file")),
    ("ILSVRC2012_img_val.tar", "archives", lambda d: fifo(d / "ILSVRC2012_img_val.tar"),
     ("ILSVRC2012_img_val.tar (", "is a FIFO, not a regular file")),
    ("ILSVRC2012_img_train.tar", "archives", lambda d: fifo(d / "ILSVRC2012_img_train.tar"),
     ("ILSVRC2012_img_train.tar (", "is a FIFO, not a regular file")),
    ("devkit tar.gz", "archives", lambda d: fifo(d / f"{DEVKIT}.tar.gz"),
     (f"{DEVKIT}.tar.gz (", "is a FIFO, not a regular file")),
    ("extracted ground truth", "archives", lambda d: (extract_devkit(d), fifo(d / TRUTH)),
     ("_validation_ground_truth.txt (", "is a FIFO, not a regular file")),
    ("extracted meta.mat", "archives", lambda d: (extract_devkit(d), fifo(d / DEVKIT / "data" / "meta.mat")),
     ("data/meta.mat (", "is a FIFO, not a regular file")),
    ("folder val image", "folder", lambda d: fifo(next((d / "val").glob("*/*.JPEG"))),
     "not a regular file (a broken link, a FIFO or a device), not an image"),
    ("ground truth '²'", "archives", lambda d: rewrite_truth(d, lambda lines: ["²", *lines[1:]]),
     "ILSVRC2012_validation_ground_truth.txt line 1: '²' is not an ILSVRC2012_ID (one number a line)"),
    ("ground truth of 5,000 digits", "archives", lambda d: rewrite_truth(d, lambda lines: ["9" * 5000, *lines[1:]]),
     "ILSVRC2012_validation_ground_truth.txt line 1: '9999999999999999999999999999999999999999' is not an "
     "ILSVRC2012_ID"),
    ("archives, empty val split", "archives", empty_archive_val, "its val split holds no images (image-net.org's"),
    ("kaggle, empty val split", "kaggle", empty_kaggle_val, "its val split holds no images (Kaggle's layout"),
]  # fmt: skip


@pytest.mark.parametrize(("layout", "spoil", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_in_one_line_and_nothing_left(layouts, tmp_path, layout, spoil, words):
    data = Path(shutil.copytree(layouts[layout], tmp_path / "data", symlinks=True))
    spoil(data)
    before = tree_digest(data)
    r = pack(data, tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("torus-train: error:") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert all(w in r.stderr for w in ((words,) if isinstance(words, str) else words)), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no packed set, no .out.partial-PID
    assert tree_digest(data) == before


def test_the_unspoilt_copies_pack(layouts, tmp_path):
    """The cases above are refused for what was spoilt, not for the copy: each layout as made packs."""
    for name, data in layouts.items():
        r = pack(data, tmp_path / name)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / name / "packed.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_pack_ended_by_sigterm_leaves_no_partial_folder(layouts, tmp_path):
    """SIGTERM (a scheduler's time limit, `kill`) while the shards are written: the temporary beside --out is
    removed and the exit is 143; without the handler Python would end unwound and leave `.out.partial-PID`."""
    code = (
        "import time, sys\n"
        "import torus_train.data.layouts.base as base\n"
        "read = base.read_image\n"
        "def slow(path):\n"
        "    time.sleep(0.5)\n"
        "    return read(path)\n"
        "base.read_image = slow\n"
        "from torus_train.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    out = tmp_path / "out"
    args = ["data", "pack", "--data", str(layouts["folder"]), "--out", str(out)]
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + LIMIT_S
        while not [q for q in tmp_path.iterdir() if q.name.startswith(".out.partial-")]:
            assert p.poll() is None and time.time() < deadline, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=LIMIT_S) == 143
    finally:
        if p.poll() is None:
            p.kill()
    assert list(tmp_path.iterdir()) == []
