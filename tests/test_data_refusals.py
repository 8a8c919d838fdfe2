"""The data commands' refusals of issue 33, one test each: `data pack` and `data index` replace only what they
wrote, `packed.json` and the index arrays are checked field by field wherever they are opened, a FIFO is named
unopened, val/ must hold train/'s classes, a folder named like an image is no image, `--seed -1` and a
symlink loop are one line, and `data.stage = node` and `bench input --device` are checked before any work.
Every refusal is exit 2 with one line, and the files there are left byte for byte as they were."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal

import numpy as np
import pytest
from clihelp import assert_one_line_error, invoke, tree_digest
from datahelp import make_index_set

from torus_train.data.packed import is_packed
from torus_train.data.packer import pack


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail instead of hanging: SIGALRM interrupts a blocking open (a FIFO without a writer)."""

    def hung(*_):
        raise TimeoutError(f"still running after {seconds} s (a hang)")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused(place, *args, words=()) -> str:
    """``torus-train ARGS`` ends in exit 2 with one line holding ``words``, and nothing under ``place`` changed."""
    before = tree_digest(place)
    with deadline(60):
        code, _, err = invoke(*args)
    assert_one_line_error(code, err)
    for w in words:
        assert w in err, err
    assert tree_digest(place) == before
    return err


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return make_index_set(tmp_path_factory.mktemp("src") / "d", n_train=9, n_val=3, size=16)


@pytest.fixture()
def packed(source, tmp_path):
    return pack(source, tmp_path / "P", shard_mb=0.01)


def edit_meta(path, change) -> None:
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


# ---------------------------------------------------------------------------------------------------------
# writers replace only what they wrote
# ---------------------------------------------------------------------------------------------------------
def test_pack_again_replaces_an_earlier_set_whole(source, packed):
    old = json.loads((packed / "packed.json").read_text())
    code, _, err = invoke("data", "pack", "--data", str(source), "--out", str(packed), "--shard-mb", "1", "--seed", "5")
    assert code == 0, err
    new = json.loads((packed / "packed.json").read_text())
    assert new["seed"] == 5 and len(new["splits"]["train"]["shards"]) < len(old["splits"]["train"]["shards"])
    assert sorted(p.name for p in packed.iterdir() if p.suffix == ".tar") == ["train-000000.tar", "val-000000.tar"]


@pytest.mark.parametrize("extra", ["notes.txt", "train-000099.tar", "extra.npy", ".hidden", "sub/"])
def test_pack_again_over_a_set_holding_a_users_file_is_refused(source, packed, extra):
    if extra.endswith("/"):
        (packed / extra).mkdir()
        (packed / extra / "mine").write_text("keep")
    else:
        (packed / extra).write_text("keep")
    err = refused(
        packed.parent,
        "data",
        "pack",
        "--data",
        str(source),
        "--out",
        str(packed),
        words=(f"--out {packed}: an older packed data set that also holds {extra.rstrip('/')}", "left untouched"),
    )
    assert "move that out first" in err


def test_pack_again_over_a_set_whose_packed_json_lists_no_files_is_refused(source, packed):
    edit_meta(packed / "packed.json", lambda m: m.update(splits=[]))
    refused(
        packed.parent,
        "data",
        "pack",
        "--data",
        str(source),
        "--out",
        str(packed),
        words=(f"--out {packed}: an older packed data set whose packed.json is damaged", "left untouched"),
    )


def test_index_again_over_an_index_holding_a_users_file_is_refused(source, tmp_path):
    idx = tmp_path / "idx"
    code, _, err = invoke("data", "index", "--data", str(source), "--index", str(idx))
    assert code == 0, err
    code, _, err = invoke("data", "index", "--data", str(source), "--index", str(idx))  # its own: replaced
    assert code == 0, err
    (idx / "todo.txt").write_text("mine")
    refused(
        tmp_path,
        "data",
        "index",
        "--data",
        str(source),
        "--index",
        str(idx),
        words=("an older data index that also holds todo.txt",),
    )
    (idx / "todo.txt").unlink()
    (idx / "train.names.npy").unlink()
    os.symlink("/etc/hostname", idx / "train.names.npy")  # one of its names, but a link: not what it wrote
    refused(tmp_path, "data", "index", "--data", str(source), "--index", str(idx), words=("train.names.npy",))


# ---------------------------------------------------------------------------------------------------------
# packed.json and the arrays, checked like the spec
# ---------------------------------------------------------------------------------------------------------
def _drop(path):
    def change(m):
        *parents, last = path
        for k in parents:
            m = m[k]
        del m[last]

    return change


def _put(path, value):
    def change(m):
        *parents, last = path
        for k in parents:
            m = m[k]
        m[last] = value

    return change


PACKED_FAULTS = {
    "a missing split": (_drop(("splits", "val")), "splits.val.classes: missing"),
    "a shard without sha256": (
        _drop(("splits", "train", "shards", 0, "sha256")),
        "splits.train.shards[0]: sha256: missing",
    ),
    "bytes 'x'": (_put(("bytes",), "x"), "bytes: 'x' must be an integer"),
    "a shard's bytes 'x'": (
        _put(("splits", "train", "shards", 0, "bytes"), "x"),
        "splits.train.shards[0]: bytes: 'x' must be an integer",
    ),
    "a numeric shard name": (
        _put(("splits", "train", "shards", 0, "name"), 7),
        "splits.train.shards[0]: name: 7 must be a string",
    ),
    "a shard name with a path": (
        _put(("splits", "train", "shards", 0, "name"), "../../etc/passwd"),
        "splits.train.shards[0].name: '../../etc/passwd' is not a train shard's name",
    ),
    "integer class names": (
        _put(("splits", "train", "classes"), [0, 1, 2]),
        "splits.train.classes[0]: 0 must be a class name",
    ),
    "a negative count": (_put(("splits", "val", "count"), -1), "splits.val.count: -1 must be >= 0"),
    "a non-finite shard size": (_put(("shard_mb",), float("nan")), "shard_mb: nan must be a finite number"),
    "splits a list": (_put(("splits",), []), "packed.json"),
    "a shard list of strings": (
        _put(("splits", "val", "shards"), ["val-000000.tar"]),
        "splits.val.shards[0]: must hold a JSON object, not a string",
    ),
    "a version of another kind": (_put(("version",), "1"), "packed set version 1 is not 1"),
}


@pytest.mark.parametrize("fault", sorted(PACKED_FAULTS))
def test_damaged_packed_json_is_one_line_in_check_and_before_launch(packed, tmp_path, fault):
    change, words = PACKED_FAULTS[fault]
    edit_meta(packed / "packed.json", change)
    refused(tmp_path, "data", "check", "--data", str(packed), words=(words,))
    refused(
        tmp_path,
        "run",
        "--gpus",
        "1",
        "--grid",
        "1x1",
        "--steps",
        "1",
        "--data",
        str(packed),
        "--set",
        "model.num_classes=3",
        "--out",
        str(tmp_path / "run"),
        words=(words,),
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "name, array, words",
    [
        ("train.labels.npy", np.zeros(9, np.float64), "float64 (9,), expected int32 of 9 entries"),
        ("val.crc32.npy", np.zeros((3, 1), np.uint32), "uint32 (3, 1), expected uint32 of 3 entries"),
        ("train.starts.npy", np.zeros(2, np.int64), "expected int64 of"),
        ("val.sizes.npy", np.array(["a", "b", "c"]), "<U1 (3,), expected int64"),
    ],
)
def test_damaged_packed_arrays_are_named(packed, tmp_path, name, array, words):
    np.save(packed / name, array)
    refused(tmp_path, "data", "check", "--data", str(packed), words=(str(packed / name), words))


def test_labels_outside_the_classes_are_refused(packed, tmp_path):
    """packed.json's classes cut to two: the arrays still match their checksum, but label 2 has no class."""
    edit_meta(packed / "packed.json", _put(("splits", "train", "classes"), ["c0", "c1"]))
    refused(tmp_path, "data", "check", "--data", str(packed), words=("train.labels.npy holds labels outside",))


@pytest.mark.parametrize(
    "name, array, words",
    [
        ("train.labels.npy", np.zeros(9, np.int64), "int64 (9,), expected int32 of 9 entries"),
        ("val.offsets.npy", np.zeros(2, np.int64), "expected int64 of 4 entries"),
    ],
)
def test_damaged_index_arrays_are_named(source, tmp_path, name, array, words):
    data = tmp_path / "d"
    shutil.copytree(source, data)
    code, _, err = invoke("data", "index", "--data", str(data))
    assert code == 0, err
    np.save(data / ".torus-train-index" / name, array)
    refused(tmp_path, "data", "check", "--data", str(data), words=(name, words))
    refused(
        tmp_path,
        "run",
        "--gpus",
        "1",
        "--grid",
        "1x1",
        "--steps",
        "1",
        "--data",
        str(data),
        "--set",
        "model.num_classes=3",
        "--out",
        str(tmp_path / "run"),
        words=(name, words),
    )


def test_integer_class_names_in_an_index_are_refused_before_launch(source, tmp_path):
    data = tmp_path / "d"
    shutil.copytree(source, data)
    invoke("data", "index", "--data", str(data))
    edit_meta(data / ".torus-train-index" / "meta.json", _put(("splits", "val", "classes"), [0, 1, 2]))
    for args in (["run"], ["run", "--dry-run"]):
        refused(
            tmp_path,
            *args,
            "--gpus",
            "1",
            "--grid",
            "1x1",
            "--steps",
            "1",
            "--data",
            str(data),
            "--set",
            "model.num_classes=3",
            "--out",
            str(tmp_path / "run"),
            words=("splits.val.classes[0]: 0 must be",),
        )


@pytest.mark.parametrize(
    "where", ["packed.json", "train.offsets.npy", "index meta.json", "index val.labels.npy", "shard"]
)
def test_a_fifo_is_refused_by_name_unopened(source, packed, tmp_path, where):
    if where.startswith("index"):
        data = tmp_path / "d"
        shutil.copytree(source, data)
        invoke("data", "index", "--data", str(data))
        fifo, target = data / ".torus-train-index" / where.split()[1], data
    else:
        fifo = packed / ("train-000000.tar" if where == "shard" else where)
        target = packed
    fifo.unlink()
    os.mkfifo(fifo)
    what = "is a FIFO, not a regular file" if where != "shard" else "not a regular file"
    refused(tmp_path, "data", "check", "--data", str(target), words=(fifo.name, what))
    # a shard is checked by the launcher's data step, before the run folder is made
    refused(
        target,
        "run",
        "--gpus",
        "1",
        "--grid",
        "1x1",
        "--steps",
        "1",
        "--data",
        str(target),
        "--set",
        "model.num_classes=3",
        "--out",
        str(tmp_path / "run"),
        words=(f"{fifo.name}",),
    )
    assert not (tmp_path / "run").exists()


def test_overwrite_keeps_the_old_results_when_the_data_is_refused(packed, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"steps": 1}')
    shard = packed / "train-000000.tar"
    shard.write_bytes(shard.read_bytes()[:100])  # truncated: found by the data step, not the pre-launch check
    refused(
        tmp_path,
        "run",
        "--gpus",
        "1",
        "--grid",
        "1x1",
        "--steps",
        "1",
        "--data",
        str(packed),
        "--overwrite",
        "--set",
        "model.num_classes=3",
        "--out",
        str(run),
        words=("train-000000.tar",),
    )


# ---------------------------------------------------------------------------------------------------------
# flags and folders
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_pack_seed_out_of_range(source, tmp_path, seed):
    refused(
        tmp_path,
        "data",
        "pack",
        "--data",
        str(source),
        "--out",
        str(tmp_path / "P"),
        "--seed",
        seed,
        words=(f"--seed: {seed} must be between 0 and 2**63-1",),
    )
    assert not (tmp_path / "P").exists()


@pytest.mark.parametrize("command", [["pack", "--out", "P"], ["index"], ["check"]])
def test_symlink_loop_as_data(tmp_path, command):
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    with contextlib.chdir(tmp_path):
        refused(tmp_path, "data", command[0], "--data", "loop", *command[1:], words=("--data loop: a symlink loop",))


def test_symlink_loop_as_run_data(tmp_path):
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    with contextlib.chdir(tmp_path):
        refused(
            tmp_path,
            "run",
            "--data",
            "loop",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "r"),
            words=("data.source: loop: a symbolic link that leads nowhere",),
        )


def test_demo_seed_out_of_range_writes_nothing(tmp_path):
    refused(
        tmp_path,
        "data",
        "demo",
        "--out",
        str(tmp_path / "d"),
        "--seed",
        "-1",
        words=("--seed: -1 must be between 0 and",),
    )
    assert not (tmp_path / "d").exists()


def _differing(source, tmp_path):
    data = tmp_path / "d"
    shutil.copytree(source, data)
    os.rename(data / "val" / "c2", data / "val" / "c9")
    return data


@pytest.mark.parametrize("command", [["index"], ["check"], ["pack", "--out", "P"]])
def test_val_classes_other_than_trains_are_refused(source, tmp_path, command):
    data = _differing(source, tmp_path)
    refused(
        tmp_path,
        "data",
        command[0],
        "--data",
        str(data),
        *[str(tmp_path / a) if a == "P" else a for a in command[1:]],
        words=("val/ has other classes than train/ (not in train/: c9; missing in val/: c2)",),
    )
    assert not (data / ".torus-train-index").exists() and not (tmp_path / "P").exists()


@pytest.mark.parametrize("command", [["index"], ["check"], ["pack", "--out", "P"]])
def test_a_folder_named_like_an_image_is_refused(source, tmp_path, command):
    data = tmp_path / "d"
    shutil.copytree(source, data)
    (data / "train" / "c1" / "x.JPEG").mkdir()
    refused(
        tmp_path,
        "data",
        command[0],
        "--data",
        str(data),
        *[str(tmp_path / a) if a == "P" else a for a in command[1:]],
        words=("c1/x.JPEG: a folder, not an image",),
    )


# ---------------------------------------------------------------------------------------------------------
# checked before launch
# ---------------------------------------------------------------------------------------------------------
RUN = ("run", "--gpus", "1", "--grid", "1x1", "--steps", "1", "--set", "model.num_classes=3")


@pytest.fixture()
def no_local_dirs(monkeypatch):
    for name in ("SLURM_TMPDIR", "PBS_JOBFS", "SGE_LOCALDIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)


def test_stage_without_a_node_local_folder_is_refused_before_launch(packed, tmp_path, no_local_dirs):
    refused(
        tmp_path,
        *RUN,
        "--data",
        str(packed),
        "--set",
        "data.stage=node",
        "--out",
        str(tmp_path / "r"),
        words=("data.stage = node: no node-local folder; set data.stage_dir",),
    )
    code, out, err = invoke(
        *RUN, "--dry-run", "--data", str(packed), "--set", "data.stage=node", "--out", str(tmp_path / "r")
    )
    assert code == 0 and "no node-local folder" in out + err and "(checked again at launch)" in out + err


def test_stage_dir_that_is_a_file_or_not_writable_is_refused(packed, tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("mine")
    refused(
        tmp_path,
        *RUN,
        "--data",
        str(packed),
        "--set",
        "data.stage=node",
        "--set",
        f"data.stage_dir={tmp_path / 'afile'}",
        "--out",
        str(tmp_path / "r"),
        words=(f"data.stage_dir {tmp_path / 'afile'} is a file, not a folder",),
    )
    refused(
        tmp_path,
        *RUN,
        "--data",
        str(packed),
        "--set",
        "data.stage=node",
        "--set",
        f"data.stage_dir={tmp_path / 'afile' / 'sub'}",
        "--out",
        str(tmp_path / "r"),
        words=("lies under the file",),
    )
    monkeypatch.setenv("TMPDIR", str(tmp_path / "ro"))
    (tmp_path / "ro").mkdir()
    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: False if str(p) == str(tmp_path / "ro") else real(p, mode, **kw)
    )
    refused(
        tmp_path,
        *RUN,
        "--data",
        str(packed),
        "--set",
        "data.stage=node",
        "--out",
        str(tmp_path / "r"),
        words=(f"data.stage = node: $TMPDIR {tmp_path / 'ro'}: {tmp_path / 'ro'} is not writable here",),
    )


@pytest.mark.parametrize(
    "device, words",
    [("foo", "--device: 'foo' must be cpu, cuda or cuda:N"), ("cuda:99", "--device cuda:99: this machine has")],
)
def test_bench_input_device_is_checked_before_the_scan(tmp_path, device, words):
    """The data folder does not exist: the line names the device, so the device was checked first."""
    refused(tmp_path, "bench", "input", "--data", str(tmp_path / "none"), "--device", device, words=(words,))


def test_repacked_set_is_still_read(source, packed):
    """A sanity check that the checks accept what a pack writes: the set packed twice reads and verifies."""
    from torus_train.data.packed import check_shards, load_packed

    pack(source, packed, shard_mb=0.02)
    assert is_packed(packed)
    check_shards(load_packed(packed))
