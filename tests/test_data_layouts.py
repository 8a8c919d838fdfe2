"""The layouts ImageNet ships in (data/layouts/): `data pack` from image-net.org's archives (a tar of per-class
tars, the validation tar and the devkit) and from Kaggle's layout gives the set packed from the same images in an
ImageNet-layout folder, byte for byte; validation labels come from the ground truth; nothing is extracted (peak
disk, every file the pack opens to write); a missing or malformed part is one line, exit 2; the class names reach
`torus-train report`. The archives are built here (scripts/bench/pack_layouts.py makes them; its larger run prints
the pack time and peak disk of 100 classes)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from clihelp import assert_one_line_error, invoke

from torus_train.data.layouts import LAYOUTS
from torus_train.data.layouts.archives import parse_meta_mat
from torus_train.data.packed import ShardReader, load_packed
from torus_train.data.packer import pack
from torus_train.data.samples import samples

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench" / "pack_layouts.py"
CLASSES, PER_CLASS, VAL_PER_CLASS = 4, 7, 3


def _bench():
    spec = importlib.util.spec_from_file_location("pack_layouts_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


@pytest.fixture(scope="module")
def images():
    return bench.make_images(CLASSES, PER_CLASS, VAL_PER_CLASS)


@pytest.fixture(scope="module")
def layouts(images, tmp_path_factory):
    work = tmp_path_factory.mktemp("layouts")
    return {
        "folder": bench.write_folder_layout(images, work / "folder"),
        "archives": bench.write_archives(images, work / "archives"),
        "kaggle": bench.write_kaggle(images, work / "kaggle"),
    }


@pytest.fixture(scope="module")
def packed(layouts, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed")
    return {name: pack(path, out / name, shard_mb=0.01, seed=5) for name, path in layouts.items()}


def sample_bytes(path: Path, split: str) -> list[bytes]:
    sp = load_packed(path).split(split)
    reader = ShardReader(sp)
    return [reader.read(i)[0].tobytes() for i in range(len(sp))]


def _members(path: Path) -> list[str]:
    with tarfile.open(path) as t:
        return t.getnames()


def test_archives_are_out_of_order(layouts):
    """So that an equal packed set cannot come from reading in archive order: the class tars and the validation
    images lie shuffled in the tars, and the ILSVRC2012_IDs are not in WNID order."""
    arch = layouts["archives"]
    classes = _members(arch / "ILSVRC2012_img_train.tar")
    assert sorted(classes) != classes
    vals = _members(arch / "ILSVRC2012_img_val.tar")
    assert sorted(vals) != vals
    with tarfile.open(arch / "ILSVRC2012_devkit_t12.tar.gz") as t:
        meta = t.extractfile("ILSVRC2012_devkit_t12/data/meta.mat").read()
    leaves = parse_meta_mat(meta, "meta.mat")
    assert len(leaves) == CLASSES  # the two inner WordNet nodes (num_children > 0) are not classes
    assert [leaves[i][0] for i in sorted(leaves)] != sorted(w for w, _ in leaves.values())


@pytest.mark.parametrize("layout", ["archives", "kaggle"])
def test_pack_equals_the_folders(packed, layout):
    """The same index arrays, classes, counts and shards (SHA-256) as the folder's, at the same seed."""
    got, want = bench.packed_digest(packed[layout]), bench.packed_digest(packed["folder"])
    assert got == want
    assert got["splits"]["train"]["count"] == CLASSES * PER_CLASS and len(got["splits"]["train"]["shards"]) > 3
    for split in ("train", "val"):
        assert sample_bytes(packed[layout], split) == sample_bytes(packed["folder"], split)


@pytest.mark.parametrize("layout", ["archives", "kaggle"])
def test_classes_are_sorted_wnids_named_by_their_words(packed, images, layout):
    meta = json.loads((packed[layout] / "packed.json").read_text())
    wnids = sorted(images["words"])
    assert meta["layout"] == layout and meta["splits"]["train"]["classes"] == wnids
    assert meta["class_names"] == [images["words"][w] for w in wnids]
    assert "class_names" not in json.loads((packed["folder"] / "packed.json").read_text())
    assert load_packed(packed[layout]).split("train").class_names == tuple(meta["class_names"])


@pytest.mark.parametrize("layout", ["archives", "kaggle"])
def test_validation_labels_come_from_the_ground_truth(packed, images, layout):
    """Each validation sample found by its bytes: its label is the class its ground truth names."""
    sp = load_packed(packed[layout]).split("val")
    by_bytes = {data: w for w, data in images["val"].values()}
    got = [
        (by_bytes[b], sp.classes[int(label)])
        for b, label in zip(sample_bytes(packed[layout], "val"), sp.labels, strict=True)
    ]
    assert len(got) == CLASSES * VAL_PER_CLASS and all(want == label for want, label in got)


def test_the_odd_jpegs_travel_through_the_archives(packed):
    """samples.py's JPEG kinds (progressive, grayscale, CMYK, 4:4:4) are among the archive's images, packed as
    they were."""
    packed_images = set(sample_bytes(packed["archives"], "train"))
    assert all(samples()[k].data in packed_images for k in bench.ODD_KINDS)


def test_archive_pack_extracts_nothing_and_peaks_at_the_packed_size(layouts, tmp_path):
    """The pack in a subprocess with TMPDIR inside the watched folder: the bytes there, polled, never pass
    1.1x the packed set's size, and the only files it opens to write are the packed set's own."""
    out = tmp_path / "o" / "P"
    r = bench.measure_pack(layouts["archives"], out, shard_mb=0.01)
    assert r["rc"] == 0, r["stderr"]
    assert r["packed_bytes"] > 0 and r["peak_bytes"] < 1.1 * r["packed_bytes"], r
    final = {p.name for p in out.iterdir()}
    assert r["written"] and all(Path(w).parent.parent == out.parent for w in r["written"]), r["written"]
    assert {Path(w).name for w in r["written"]} == final  # shards, arrays and packed.json: nothing else
    assert not list((tmp_path / "o" / "tmp").iterdir())


def test_cli_names_the_layout_and_the_class_names(layouts, images, tmp_path):
    code, out, err = invoke("data", "pack", "--data", str(layouts["kaggle"]), "--out", str(tmp_path / "P"))
    assert code == 0, err
    first = sorted(images["words"])[0]
    assert "layout: Kaggle's layout" in out and f"class names: {CLASSES} ({first} {images['words'][first]};" in out
    assert "test" not in json.dumps(load_packed(tmp_path / "P").meta["splits"])  # Kaggle's test/ left out


# --------------------------------------------------------------------------------------------------------
# what is missing or malformed: one line, exit 2, nothing written
# --------------------------------------------------------------------------------------------------------
def copy(layouts, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(layouts[name], tmp_path / name))


def refused(data: Path, tmp_path: Path, words: str) -> None:
    code, _, err = invoke("data", "pack", "--data", str(data), "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, words)
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def rewrite_devkit(path: Path, change) -> None:
    """The devkit tar.gz with each member's bytes passed through change(name, data) (None drops it)."""
    with tarfile.open(path) as t:
        members = [(m.name, t.extractfile(m).read()) for m in t if m.isfile()]
    with tarfile.open(path, "w:gz") as t:
        for name, data in members:
            data = change(name, data)
            if data is not None:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


def test_val_tar_without_the_devkit_names_it(layouts, tmp_path):
    data = copy(layouts, "archives", tmp_path)
    (data / "ILSVRC2012_devkit_t12.tar.gz").unlink()
    refused(data, tmp_path, "ILSVRC2012_devkit_t12.tar.gz missing (the validation labels: data/ILSVRC2012_validation")


def test_only_the_train_tar_names_the_val_tar(layouts, tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    shutil.copy(layouts["archives"] / "ILSVRC2012_img_train.tar", data)
    refused(data, tmp_path, "ILSVRC2012_img_train.tar here but ILSVRC2012_img_val.tar missing")


def test_devkit_without_the_ground_truth(layouts, tmp_path):
    data = copy(layouts, "archives", tmp_path)
    rewrite_devkit(data / "ILSVRC2012_devkit_t12.tar.gz", lambda n, d: None if "ground_truth" in n else d)
    refused(data, tmp_path, "holds no data/ILSVRC2012_validation_ground_truth.txt")


def test_ground_truth_of_another_count(layouts, tmp_path):
    data = copy(layouts, "archives", tmp_path)
    rewrite_devkit(
        data / "ILSVRC2012_devkit_t12.tar.gz", lambda n, d: d[: d.rindex(b"\n", 0, -1) + 1] if "truth" in n else d
    )
    n = CLASSES * VAL_PER_CLASS
    refused(data, tmp_path, f"ILSVRC2012_img_val.tar: {n} validation images, but ")


def test_val_image_with_no_ground_truth_line(layouts, images, tmp_path):
    """One image renamed past the ground truth's last line (the counts still agree)."""
    data = copy(layouts, "archives", tmp_path)
    with tarfile.open(layouts["archives"] / "ILSVRC2012_img_val.tar") as src:
        members = [(m.name, src.extractfile(m).read()) for m in src]
    members[0] = ("ILSVRC2012_val_00099999.JPEG", members[0][1])
    with tarfile.open(data / "ILSVRC2012_img_val.tar", "w") as t:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            t.addfile(info, io.BytesIO(content))
    refused(data, tmp_path, "ILSVRC2012_img_val.tar:ILSVRC2012_val_00099999.JPEG: no ground-truth line of its number")


def test_meta_mat_that_is_not_one(layouts, tmp_path):
    data = copy(layouts, "archives", tmp_path)
    rewrite_devkit(data / "ILSVRC2012_devkit_t12.tar.gz", lambda n, d: b"not matlab" if n.endswith("meta.mat") else d)
    refused(data, tmp_path, "not the devkit's meta.mat")


@pytest.mark.parametrize(
    "bad, words",
    [
        (
            "ILSVRC2012_val_00000001 n01440764 1 2 3 4",
            "line 2: 'ILSVRC2012_val_00000001 n01440764 1 2 3 4' is not ImageId,",
        ),
        ("ILSVRC2012_val_00000001,", "line 2: 'ILSVRC2012_val_00000001,' is not ImageId,PredictionString"),
        ("ILSVRC2012_val_00000001,12 7 40 30", "is not ImageId,PredictionString with the class first"),
    ],
)
def test_malformed_val_solution(layouts, tmp_path, bad, words):
    data = copy(layouts, "kaggle", tmp_path)
    lines = (data / "LOC_val_solution.csv").read_text().splitlines()
    (data / "LOC_val_solution.csv").write_text("\n".join([lines[0], bad, *lines[2:]]) + "\n")
    refused(data, tmp_path, words)


def test_val_solution_without_its_header(layouts, tmp_path):
    data = copy(layouts, "kaggle", tmp_path)
    lines = (data / "LOC_val_solution.csv").read_text().splitlines()
    (data / "LOC_val_solution.csv").write_text("\n".join(lines[1:]) + "\n")
    refused(data, tmp_path, "LOC_val_solution.csv line 1: expected the header ImageId,PredictionString")


def test_kaggle_val_image_without_a_row(layouts, tmp_path):
    data = copy(layouts, "kaggle", tmp_path)
    val = data / "ILSVRC/Data/CLS-LOC/val"
    shutil.copy(val / "ILSVRC2012_val_00000001.JPEG", val / "ILSVRC2012_val_00000999.JPEG")
    refused(data, tmp_path, "ILSVRC2012_val_00000999.JPEG: no row for ILSVRC2012_val_00000999 in ")


def test_kaggle_without_its_solution_names_it(layouts, tmp_path):
    data = copy(layouts, "kaggle", tmp_path)
    (data / "LOC_val_solution.csv").unlink()
    refused(data, tmp_path, "Kaggle's ImageNet layout without LOC_val_solution.csv (the validation labels)")


def test_a_folder_of_nothing_known_lists_the_layouts(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "notes.txt").write_text("x")
    refused(
        data, tmp_path, "not a data set torus-train can pack; expected " + ", or ".join(lay.help for lay in LAYOUTS)
    )


# --------------------------------------------------------------------------------------------------------
# the class names reach the report; the larger copy runs
# --------------------------------------------------------------------------------------------------------
def test_class_names_reach_the_report(packed, images, tmp_path):
    """Two steps of a 1-rank run on the set packed from the archives; the report's lines and its JSON name the
    classes with their words."""
    out = tmp_path / "run"
    args = ["--gpus", "1", "--grid", "1x1", "--data", str(packed["archives"]), "--model", "resnet18"]
    args += ["--image-size", "16", "--steps", "2", "--out", str(out), "--set", f"model.num_classes={CLASSES}"]
    args += ["--set", "checkpoint.every_epochs=0", "--set", "checkpoint.at_end=false", "--set", "eval.every_epochs=0"]
    args += ["--set", "schedule.stages=[{until_epoch=1,global_batch=4}]", "--set", "data.loader=torchvision"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run(
        [sys.executable, "-m", "torus_train", "run", *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    wnids = sorted(images["words"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["classes"] == wnids and summary["class_names"] == [images["words"][w] for w in wnids]
    code, text, err = invoke("report", str(out), "--no-png", "--json", str(tmp_path / "r.json"))
    assert code == 0, err
    assert f"classes: {CLASSES} ({wnids[0]} {images['words'][wnids[0]]}; " in text
    assert (
        json.loads((tmp_path / "r.json").read_text())["runs"][0]["summary"]["class_names"][0]
        == images["words"][wnids[0]]
    )


def test_the_bench_script_runs_at_toy_size(tmp_path):
    """scripts/bench/pack_layouts.py end to end (the 100-class figures in docs/data.md come from it)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = ["--classes", "3", "--per-class", "4", "--val-per-class", "2", "--size", "16", "--work", str(tmp_path)]
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [
        line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["folder"], ["archives"], ["kaggle"])
    ]
    assert [row[0] for row in rows] == ["folder", "archives", "kaggle"] and all(row[-1] == "yes" for row in rows)
    assert all(float(row[4]) < 1.1 for row in rows)
    assert np.isfinite([float(row[1]) for row in rows]).all()


@pytest.mark.parametrize("layout", ["archives", "kaggle"])
def test_run_on_an_unpacked_layout_says_to_pack_it(layouts, layout, tmp_path):
    data = layouts[layout]
    code, _, err = invoke(
        "run", "--dry-run", "--gpus", "1", "--grid", "1x1", "--data", str(data), "--out", str(tmp_path)
    )
    assert_one_line_error(
        code, err, f"which a run does not read; pack it once with: torus-train data pack --data {data}"
    )


def test_truncated_train_tar_is_one_line(layouts, tmp_path):
    data = copy(layouts, "archives", tmp_path)
    tar = data / "ILSVRC2012_img_train.tar"
    os.truncate(tar, tar.stat().st_size // 2)
    refused(data, tmp_path, "ILSVRC2012_img_train.tar: not a readable tar (")


def test_a_folder_beside_the_archives_packs_as_before(layouts, packed, tmp_path):
    """train/ and val/ next to the tars (extracted, tars kept): the folder is packed, as it was before."""
    data = copy(layouts, "folder", tmp_path)
    shutil.copy(layouts["archives"] / "ILSVRC2012_img_val.tar", data)  # no devkit: would be refused as archives
    out = pack(data, tmp_path / "P", shard_mb=0.01, seed=5)
    assert bench.packed_digest(out) == bench.packed_digest(packed["folder"])
    assert load_packed(out).meta["layout"] == "folder"


def test_class_names_are_checked_where_the_set_is_opened(packed, tmp_path):
    """`data check` passes a set packed from the archives; class_names of another length is one line, exit 2."""
    data = Path(shutil.copytree(packed["archives"], tmp_path / "P"))
    code, out, err = invoke("data", "check", "--data", str(data))
    assert code == 0 and "checksums match" in out, err
    meta = json.loads((data / "packed.json").read_text())
    meta["class_names"] = meta["class_names"][:-1]
    (data / "packed.json").write_text(json.dumps(meta))
    code, _, err = invoke("data", "check", "--data", str(data))
    assert_one_line_error(code, err, "class_names: must be one string per class of splits.train.classes")


def test_kaggles_image_folder_itself_points_at_the_download(layouts, tmp_path):
    cls_loc = layouts["kaggle"] / "ILSVRC/Data/CLS-LOC"
    code, _, err = invoke("data", "pack", "--data", str(cls_loc), "--out", str(tmp_path / "P"))
    assert_one_line_error(
        code, err, f"give --data {layouts['kaggle']}, the folder holding ILSVRC/ and LOC_val_solution"
    )
