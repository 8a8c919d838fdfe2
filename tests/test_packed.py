"""Packed sets (`torus-train data pack`): the shards read back through both loaders (every sample once per
epoch, labels right, order reproducible), damaged shards named or skipped, the pack target rules, the
epoch order's guarantees, and no file I/O on the training thread."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import threading

import numpy as np
import pytest
from datahelp import decode_indices, make_index_set

from torus_train.data import make_loader
from torus_train.data.checks import DataError
from torus_train.data.packed import check_shards, epoch_order, is_packed, load_packed, split_classes
from torus_train.data.packer import pack
from torus_train.data.sharding import shard
from torus_train.errors import UserError

KINDS = ["dali", "torchvision"]
N_TRAIN, N_VAL = 45, 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_index_set(tmp_path_factory.mktemp("packsrc") / "d", n_train=N_TRAIN, n_val=N_VAL, size=24)


@pytest.fixture(scope="module")
def packed(folder, tmp_path_factory):
    return pack(folder, tmp_path_factory.mktemp("packed") / "s", shard_mb=0.01)  # about 4 samples per shard


def loader(kind, root, split, **kw):
    args = dict(
        rank=0,
        world_size=1,
        batch_size=4,
        image_size=16,
        num_classes=3,
        seed=3,
        channels_last=False,
        device="cpu",
        num_threads=1,
        verify=False,
        shuffle_buffer=8,
    )
    args.update(kw)
    return make_loader(kind, root, split, **args)


def folder_labels(folder, split, n):
    """Label of each folder index (make_index_set numbers files by class, then name)."""
    counts = [len(list((folder / split / f"c{c}").iterdir())) for c in range(3)]
    return np.repeat(np.arange(3), counts)[:n]


def test_layout_is_webdataset_and_index_matches(packed, folder):
    p = load_packed(packed)
    p.verify()
    meta = json.loads((packed / "packed.json").read_text())
    assert meta["splits"]["train"]["count"] == N_TRAIN and len(meta["splits"]["train"]["shards"]) > 3
    assert split_classes(packed) == {"train": ("c0", "c1", "c2"), "val": ("c0", "c1", "c2")}
    sp = p.split("train")
    with tarfile.open(sp.shard_paths[1]) as t:  # a plain tar: KEY.jpg then KEY.cls, KEY = the sample number
        members = t.getmembers()
        first = int(sp.starts[1])
        assert [m.name for m in members[:2]] == [f"{first:08d}.jpg", f"{first:08d}.cls"]
        assert members[0].offset_data == sp.offsets[first] and members[0].size == sp.sizes[first]
        assert int(t.extractfile(members[1]).read()) == sp.labels[first]


@pytest.mark.parametrize("kind", KINDS)
def test_every_sample_once_per_epoch_with_its_label(kind, packed, folder):
    truth = folder_labels(folder, "train", N_TRAIN)
    world, per_epoch = 2, []
    for epoch in (0, 1):
        seen = []
        for rank in range(world):  # torchvision without worker processes: their start-up is the cost here
            ld = loader(kind, packed, "train", rank=rank, world_size=world, num_threads=int(kind == "dali"))
            ld.set_epoch(epoch)
            for x, y in ld:
                idx = decode_indices(x)
                assert [int(truth[i]) for i in idx] == y.tolist()  # every label is its image's
                seen += idx
            pad = ld.pad
            ld.close()
        assert len(seen) == 48 and pad == 3  # 45 samples, 2 ranks x 6 steps x 4: 3 wrapped around
        assert sorted(set(seen)) == list(range(N_TRAIN))
        per_epoch.append(seen)
    assert per_epoch[0] != per_epoch[1]  # reshuffled per epoch


def test_order_is_reproducible_in_another_process(packed):
    """Another process (numpy and PIL only) draws rank 1's epoch-1 shard and reads its samples' colours: the
    same images in the same order as the DALI loader here."""
    code = (
        "import sys, io, json, numpy as np; sys.path.insert(0, 'tests'); from PIL import Image; "
        "from datahelp import colour_index; from torus_train.data.base import LoaderConfig, epoch_shard; "
        "from torus_train.data.packed import load_packed, ShardReader; "
        f"sp = load_packed({str(packed)!r}).split('train'); "
        "cfg = LoaderConfig('train', 1, 2, 4, 16, 3, False, 1, shuffle_buffer=8); r = ShardReader(sp); "
        "rgb = lambda i: np.asarray(Image.open(io.BytesIO(r.read(int(i))[0].tobytes())).convert('RGB'))"
        ".reshape(-1, 3).mean(0); "
        "print(json.dumps([colour_index(rgb(i)) for i in epoch_shard(sp, cfg, 1).indices]))"
    )
    ours = loader("dali", packed, "train", rank=1, world_size=2)
    ours.set_epoch(1)
    here = [i for x, _ in ours for i in decode_indices(x)]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here and len(set(here)) > 10


@pytest.mark.parametrize("kind", KINDS)
def test_validation_reads_in_order(kind, packed):
    ld = loader(kind, packed, "val", batch_size=5, num_threads=int(kind == "dali"))
    got = [(i, int(v)) for x, y in ld for i, v in zip(decode_indices(x), y, strict=True)]
    assert [i for i, v in got if v >= 0] == list(range(N_VAL)) and len(got) == 15


def test_epoch_order_is_a_permutation_in_shard_units():
    starts = np.array([0, 100, 200, 300, 400, 450])
    for epoch in range(3):
        o = epoch_order(starts, epoch, seed=1, buffer=16)
        assert sorted(o.tolist()) == list(range(450))
        shard_of = np.searchsorted(starts, o, side="right") - 1
        # a rank's contiguous part (1/5 of the epoch) touches few shards: its own run of shards, not all
        part = shard(450, 0, 5, 10, epoch=epoch, order=o)
        assert len(set(shard_of[:90].tolist())) <= 3 and len(part.indices) == 90
        assert np.abs(np.arange(450) - np.argsort(np.argsort(o))).max() < 450  # a permutation, drawn
    assert not np.array_equal(epoch_order(starts, 0, 1, 16), epoch_order(starts, 1, 1, 16))
    assert np.array_equal(epoch_order(starts, 2, 1, 16), epoch_order(starts, 2, 1, 16))


def damaged_copy(packed, tmp_path, how):
    """A copy of the packed set with train shard 1 truncated or with one sample's bytes altered."""
    import shutil

    dst = tmp_path / "damaged"
    shutil.copytree(packed, dst)
    sp = load_packed(dst).split("train")
    shard_path = dst / "train-000001.tar"
    victim = int(sp.starts[1])
    data = bytearray(shard_path.read_bytes())
    if how == "truncated":
        data = data[: int(sp.offsets[victim]) + 50]  # the shard's first image cut, the rest gone
    else:
        at = int(sp.offsets[victim]) + 100
        data[at : at + 20] = bytes(20)
    shard_path.write_bytes(bytes(data))
    return dst, victim


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["truncated", "altered"])
def test_damaged_shard_is_named_or_skipped(kind, how, packed, tmp_path):
    dst, victim = damaged_copy(packed, tmp_path, how)
    workers = int(kind == "dali")  # torchvision: no worker processes (their start-up is the cost here)
    with pytest.raises(DataError) as e:
        for _ in loader(kind, dst, "train", num_threads=workers):
            pass
    msg = str(e.value)
    assert "\n" not in msg and "train-000001.tar:" in msg and f"{how} shard" in msg, msg
    ld = loader(kind, dst, "train", on_corrupt="skip", num_threads=workers)
    steps = sum(1 for _ in ld)
    assert steps == len(ld) == 12
    skipped = list(ld.corrupt.files)
    assert f"{dst}/train-000001.tar:{victim:08d}" in skipped
    if how == "truncated":  # the launcher's check names the shard before any rank starts
        with pytest.raises(DataError, match="bytes, packed as"):
            load_packed(dst).verify()
    else:  # `data check` reads every shard
        with pytest.raises(DataError, match=re.escape("train-000001.tar: its bytes differ from those packed")):
            check_shards(load_packed(dst))


def test_pack_target_rules(folder, packed, tmp_path):
    with pytest.raises(UserError, match="--shard-mb: 0 must be between"):
        pack(folder, tmp_path / "x", shard_mb=0)
    with pytest.raises(UserError, match="--shard-mb: 1e"):
        pack(folder, tmp_path / "x", shard_mb=1e9)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    with pytest.raises(UserError, match="not a packed data set of torus-train"):
        pack(folder, tmp_path / "notes")
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep"
    with pytest.raises(UserError, match="inside the data folder"):
        pack(folder, folder / "train" / "packed")
    assert not is_packed(tmp_path / "x") and not (tmp_path / "x").exists()


def test_interrupted_pack_leaves_no_set(folder, tmp_path, monkeypatch):
    import torus_train.data.layouts.base as L

    calls = []

    def boom(path):
        calls.append(path)
        if len(calls) == 30:
            raise KeyboardInterrupt
        return path.read_bytes()

    monkeypatch.setattr(L, "read_image", boom)  # how the packer reads a file
    with pytest.raises(KeyboardInterrupt):
        pack(folder, tmp_path / "s")
    assert list(tmp_path.iterdir()) == []  # no target, no temporary


def test_training_thread_opens_no_file(packed, folder):
    """Python-level opens (audit hook "open") from the thread that iterates: none, for both layouts; the
    reader threads open the files (a packed set: each shard once)."""
    by_thread: dict[int, list[str]] = {}
    on = [False]

    def hook(event, args):
        if on[0] and event == "open" and isinstance(args[0], (str, bytes)):
            by_thread.setdefault(threading.get_ident(), []).append(str(args[0]))

    sys.addaudithook(hook)
    for root in (folder, packed):
        by_thread.clear()
        ld = loader("dali", root, "train", io_workers=2)
        on[0] = True
        n = sum(len(y) for _, y in ld)
        on[0] = False
        ld.close()
        mine = by_thread.pop(threading.get_ident(), [])
        assert mine == [], mine
        reads = [p for v in by_thread.values() for p in v if p.endswith((".JPEG", ".tar"))]
        if root == packed:
            assert 0 < len(reads) <= len(load_packed(packed).split("train").shard_paths) * 2
        else:
            assert len(reads) >= n  # one open per image


def test_cli_pack_and_bad_input(folder, packed, tmp_path):
    from clihelp import assert_one_line_error, invoke

    (tmp_path / "afile").write_text("mine")
    code, out, _ = invoke("data", "pack", "--data", str(folder), "--out", str(tmp_path / "s"), "--shard-mb", "1")
    assert code == 0 and "train: 3 classes, 45 samples, 1 shards" in out and is_packed(tmp_path / "s")
    for args, message in (
        (["--out", str(tmp_path / "t"), "--shard-mb", "0"], "--shard-mb: 0 must be between"),
        (["--out", str(tmp_path / "t"), "--shard-mb", "nan"], "--shard-mb: nan must be between"),
        (["--out", str(tmp_path / "afile")], "a file is there, not a packed data set"),
    ):
        code, _, err = invoke("data", "pack", "--data", str(folder), *args)
        assert_one_line_error(code, err, message)
    assert (tmp_path / "afile").read_text() == "mine"
    (tmp_path / "neither").mkdir()
    code, _, err = invoke(
        "run",
        "--gpus",
        "1",
        "--grid",
        "1x1",
        "--steps",
        "1",
        "--data",
        str(tmp_path / "neither"),
        "--out",
        str(tmp_path / "run"),
    )
    assert_one_line_error(code, err, "neither an ImageNet-layout folder (train/CLASS/*, val/CLASS/*) nor a packed set")
    code, _, err = invoke(
        "run",
        "--gpus",
        "1",
        "--grid",
        "1x1",
        "--steps",
        "1",
        "--data",
        str(folder),
        "--set",
        "data.stage=node",
        "--set",
        "model.num_classes=3",
        "--out",
        str(tmp_path / "run2"),
    )
    assert_one_line_error(code, err, "data.stage = node needs a packed set")


def test_decode_threads_use_the_bound_cores():
    from torus_train.data.readers import decode_threads

    assert decode_threads(4, affinity=8, machine=32, usable=8) == 8  # bound by srun/mpirun: all its cores
    assert decode_threads(4, affinity=32, machine=32, usable=32) == 8  # unbound: the node's cores shared
    assert decode_threads(4, affinity=2, machine=2, usable=2) == 1


def test_dali_webdataset_reader_reads_the_shards(packed):
    """DALI's own WebDataset reader (no index of its own: it scans the tar) reads KEY.jpg + KEY.cls in the
    packed order, with the packed labels."""
    from nvidia.dali import fn, pipeline_def

    sp = load_packed(packed).split("train")

    @pipeline_def(batch_size=N_TRAIN, num_threads=1, device_id=None)
    def pipe():
        img, cls = fn.readers.webdataset(
            paths=list(sp.shard_paths), ext=["jpg", "cls"], missing_component_behavior="error"
        )
        return fn.decoders.image(img, device="cpu"), cls

    p = pipe()
    p.build()
    _, cls = p.run()
    assert [int(np.array(cls[i]).tobytes()) for i in range(N_TRAIN)] == sp.labels.tolist()
