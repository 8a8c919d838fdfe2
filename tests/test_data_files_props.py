"""Property-based tests over the data files commands read and write (issue 33): hostile `packed.json` files,
packed and index arrays, index `meta.json` files, and earlier outputs holding other files as pack targets.

Each example goes through the real entry point (``torus_train.cli.main``) in process, under a deadline that
interrupts a blocking open (a FIFO), and must end in exit 0 or in exit 2 with exactly one line, no traceback,
and no file changed outside what the command was asked to write. Documents are a good file one step away
(test_file_inputs_props.mutated); arrays take any dtype, shape and values, raw bytes, or a FIFO.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from clihelp import invoke, tree_digest
from datahelp import make_index_set
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_data_refusals import deadline
from test_file_inputs_props import mutated

from torus_train.data.index import ARRAYS as INDEX_ARRAYS
from torus_train.data.packed import ARRAYS as PACKED_ARRAYS
from torus_train.data.packed import SPLITS, check_shards, load_packed, own_files
from torus_train.data.packer import pack

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
COUNT = {"examples": 0, "exit0": 0, "exit2": 0}


def one_example(place, *args) -> int:
    """Exit 0, or 2 with one line; no traceback, no hang, nothing under ``place`` changed."""
    before = tree_digest(place)
    with deadline(30):
        code, _, err = invoke(*args)
    COUNT["examples"] += 1
    assert "Traceback" not in err and code in (0, 2), (code, err)
    if code == 2:
        COUNT["exit2"] += 1
        assert err.startswith("torus-train: error:") and err.count("\n") == 1, err
    else:
        COUNT["exit0"] += 1
    assert tree_digest(place) == before
    return code


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """A data folder with its index, and a packed set of it (kept pristine: each example edits a copy)."""
    d = tmp_path_factory.mktemp("dataprops")
    data = make_index_set(d / "data", n_train=9, n_val=3, size=16)
    code, _, err = invoke("data", "index", "--data", str(data))
    assert code == 0, err
    pack(data, d / "packed", shard_mb=0.01)
    yield d
    print(
        f"\nhypothesis over data files: {COUNT['examples']} generated inputs through torus_train.cli.main: "
        f"{COUNT['exit0']} exit 0, {COUNT['exit2']} exit 2 (one line each)"
    )


def fresh(sets, name: str):
    """A copy of the pristine ``name`` under sets/work (the example's place)."""
    work = sets / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    shutil.copytree(sets / name, work / name, symlinks=True)
    return work, work / name


def hostile_file(data, path, good_doc=None) -> None:
    """Replace ``path`` by a FIFO, raw bytes, or (JSON documents) a mutated good document."""
    how = data.draw(st.sampled_from(["fifo", "bytes"] + (["json"] * 6 if good_doc is not None else [])))
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "bytes":
        path.write_bytes(data.draw(st.binary(max_size=200)))
    else:
        path.write_text(data.draw(mutated(good_doc)))


ARRAY_DTYPES = st.sampled_from([np.int8, np.int32, np.int64, np.uint8, np.uint32, np.float64, np.bool_, ">i8"])


def hostile_array(data, path, good: np.ndarray) -> None:
    """Replace the array at ``path`` by one of another dtype, shape or values, raw bytes, or a FIFO."""
    how = data.draw(st.sampled_from(["array", "array", "values", "fifo", "bytes"]))
    if how in ("fifo", "bytes"):
        hostile_file(data, path)
        return
    if how == "values":  # the right dtype and length, other values: only the checksum can tell
        a = good.copy()
        if len(a):
            a[data.draw(st.integers(0, len(a) - 1))] = data.draw(st.integers(0, 255))
    else:
        n = data.draw(st.sampled_from([0, len(good) - 1, len(good), len(good) + 1]))
        shape = data.draw(st.sampled_from([(max(n, 0),), (max(n, 0), 1), (), (1, max(n, 0))]))
        a = np.asarray(
            data.draw(
                st.lists(st.integers(-(2**31), 2**31 - 1), min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))
            ),
            dtype=np.int64,
        )
        a = a.astype(data.draw(ARRAY_DTYPES)).reshape(shape)
    np.save(path, a)


@SETTINGS
@given(data=st.data())
def test_hostile_packed_json(sets, data):
    work, packed = fresh(sets, "packed")
    good = json.loads((packed / "packed.json").read_text())
    hostile_file(data, packed / "packed.json", good)
    one_example(work, "data", "check", "--data", str(packed))
    one_example(
        work,
        "run",
        "--dry-run",
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
        str(work / "run"),
    )


@SETTINGS
@given(key=st.sampled_from([f"{s}.{k}" for s in SPLITS for k in PACKED_ARRAYS]), data=st.data())
def test_hostile_packed_arrays(sets, key, data):
    work, packed = fresh(sets, "packed")
    good = np.load(packed / f"{key}.npy")
    hostile_array(data, packed / f"{key}.npy", good)
    if one_example(work, "data", "check", "--data", str(packed)) == 0:  # only an equal array passes
        check_shards(load_packed(packed))
        assert np.array_equal(np.load(packed / f"{key}.npy"), good)


@SETTINGS
@given(key=st.sampled_from(["meta.json"] + [f"{s}.{k}" for s in SPLITS for k in INDEX_ARRAYS]), data=st.data())
def test_hostile_index_files(sets, key, data):
    work, folder = fresh(sets, "data")
    index = folder / ".torus-train-index"
    if key == "meta.json":
        hostile_file(data, index / key, json.loads((index / key).read_text()))
    else:
        hostile_array(data, index / f"{key}.npy", np.load(index / f"{key}.npy"))
    one_example(work, "data", "check", "--data", str(folder))
    one_example(
        work,
        "run",
        "--dry-run",
        "--gpus",
        "1",
        "--grid",
        "1x1",
        "--steps",
        "1",
        "--data",
        str(folder),
        "--set",
        "model.num_classes=3",
        "--out",
        str(work / "run"),
    )


EXTRAS = st.sampled_from(
    [
        "notes.txt",
        ".DS_Store",
        "train-000077.tar",
        "x.npy",
        "sub/",
        "train.labels.npy",
        "train-000000.tar",
        "packed.json.bak",
        "val-000000.tar/",
    ]
)


@SETTINGS
@given(extras=st.lists(EXTRAS, max_size=3, unique=True), seed=st.integers(0, 3))
def test_packing_again_over_an_earlier_set(sets, extras, seed):
    """An earlier set plus entries: replaced (exit 0, a valid set) only when every entry is one it lists;
    else refused with everything there unchanged. A listed name given other content is the writer's own."""
    work, packed = fresh(sets, "packed")
    own = set(own_files(json.loads((packed / "packed.json").read_text())))
    for e in extras:
        p = packed / e.rstrip("/")
        if e.endswith("/"):
            if p.exists():
                p.unlink()
            p.mkdir()
            (p / "mine").write_text("keep")
        else:
            p.write_text("user's")
    foreign = [e for e in extras if e.endswith("/") or e not in own]
    before = tree_digest(work)
    with deadline(60):
        code, _, err = invoke(
            "data",
            "pack",
            "--data",
            str(sets / "data"),
            "--out",
            str(packed),
            "--shard-mb",
            "0.01",
            "--seed",
            str(seed),
        )
    COUNT["examples"] += 1
    assert "Traceback" not in err
    if foreign:
        COUNT["exit2"] += 1
        assert code == 2 and err.count("\n") == 1 and "left untouched" in err, err
        assert tree_digest(work) == before
    else:
        COUNT["exit0"] += 1
        assert code == 0, err
        check_shards(load_packed(packed))
        assert sorted(p.name for p in packed.iterdir()) == sorted({"packed.json", *own})
