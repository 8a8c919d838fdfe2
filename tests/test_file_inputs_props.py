"""Property-based tests over the files commands read (issue: nothing lost, nothing refused late).

Hypothesis generates malformed run folders (job.json, summary.json, metrics.jsonl), bench JSON for
`plan calibrate`, step and layer profiles, hostfiles and index targets; each goes through the real entry point
(``torus_train.cli.main``) in process, or, for the run folders and step profiles that only the CPU test host's
scripts/experiments/compare_run.py reads, through that script's ``main``. Every example must end in exit 0, or
exit 2 with exactly one ``torus-train: error:`` (``compare_run.py: error:``) line and no traceback, and must
change no file outside the place the command was asked to write. Valid documents are mutated (a field replaced by any JSON value, removed, or the text cut short), so
most examples sit one step away from a good file, where a missed check would show.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys
from pathlib import Path

import pytest
from clihelp import invoke, tree_digest
from datahelp import make_index_set
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "experiments"))
import compare_run  # scripts/experiments/compare_run.py, as the scripts beside it import it

JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(10**20), 10**20),
        st.floats(),
        st.text(max_size=8),
        st.sampled_from([0, -1, 1e308, 10**400, "1", ""]),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)

GOOD_JOB = {
    "spec": {
        "model": {"arch": "resnet18", "num_classes": 10},
        "data": {"image_size": 32},
        "comm": {"algo": "torus", "compression": "none", "bucket_mb": 25.0},
    },
    "grid": {"x": 2, "y": 1, "gpus_per_node": 2},
}
GOOD_SUMMARY = {"device": "cpu", "steps": 40, "param_digests_agree": True}
GOOD_STEP = {"step": 10, "per_rank_batch": 64, "step_time": 0.12, "loss": 2.0}
GOOD_BENCH = [
    {"algo": "torus", "backend": "gloo", "grid": "2x1", "size_bytes": s, "time_us": 50 + s / 1e3, "wrong": 0}
    for s in (1024, 65536, 1 << 20, 4 << 20)
]
GOOD_PROFILE = {
    "model": "resnet18",
    "image_size": 32,
    "batch": 16,
    "num_classes": 10,
    "threads": 1,
    "forward_seconds": 0.02,
    "backward_seconds": 0.04,
    "optimizer_seconds": 0.005,
    "modules": {"conv1": 0.01, "fc": 0.002},
    "cores": 2,
    "background": 0.0,
    "clock": "cpu",
}

COUNT = {"examples": 0, "exit0": 0, "exit2": 0}


def paths_of(doc, prefix=()):
    """Every path to a value inside a JSON document."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths_of(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths_of(v, (*prefix, i))


@st.composite
def mutated(draw, good) -> str:
    """The JSON text of ``good`` with one change: a value replaced or removed, or the text cut short."""
    doc = copy.deepcopy(good)
    how = draw(st.sampled_from(["replace", "remove", "truncate", "whole"]))
    if how == "whole":
        return json.dumps(draw(JSON_VALUES))
    if how == "truncate":
        text = json.dumps(doc)
        return text[: draw(st.integers(0, len(text) - 1))]
    path = draw(st.sampled_from([p for p in paths_of(doc) if p]))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if how == "remove":
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(JSON_VALUES)
    return json.dumps(doc)


def run_cli(place: Path, *args: str, may_write: str = "") -> int:
    """One example: the entry point in ``place``; exit 0, or 2 with one line; nothing else in place changed."""
    before = tree_digest(place, may_write)
    with contextlib.chdir(place):
        code, _, err = invoke(*args)
    COUNT["examples"] += 1
    assert "Traceback" not in err, err
    assert code in (0, 2), (code, err)
    if code == 2:
        COUNT["exit2"] += 1
        assert err.startswith("torus-train: error:") and err.count("\n") == 1, err
    else:
        COUNT["exit0"] += 1
    assert tree_digest(place, may_write) == before
    return code


def run_compare(place: Path, *args: str) -> int:
    """One example through compare_run.py's main in ``place``: as run_cli, its one line naming the script."""
    before = tree_digest(place)
    err = io.StringIO()
    with contextlib.chdir(place), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = compare_run.main([*args])
    COUNT["examples"] += 1
    COUNT["exit0" if code == 0 else "exit2"] += 1
    assert code in (0, 2), (code, err.getvalue())
    if code == 2:
        assert err.getvalue().startswith("compare_run.py: error:") and err.getvalue().count("\n") == 1, err.getvalue()
    assert tree_digest(place) == before
    return code


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    (d / "bench.json").write_text(json.dumps(GOOD_BENCH))
    (d / "profile.json").write_text(json.dumps(GOOD_PROFILE))
    yield d
    print(
        f"\nhypothesis over files: {COUNT['examples']} generated inputs through torus_train.cli.main: "
        f"{COUNT['exit0']} exit 0, {COUNT['exit2']} exit 2 (one line each)"
    )


SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(which=st.sampled_from(["job.json", "summary.json", "metrics.jsonl"]), data=st.data())
def test_run_folders(place, which, data):
    run = place / "run"
    run.mkdir(exist_ok=True)
    texts = {
        "job.json": json.dumps(GOOD_JOB),
        "summary.json": json.dumps(GOOD_SUMMARY),
        "metrics.jsonl": "\n".join(json.dumps(GOOD_STEP | {"step": s}) for s in (10, 20, 30)) + "\n",
    }
    if which == "metrics.jsonl":
        lines = [json.dumps(GOOD_STEP | {"step": 10}), data.draw(mutated(GOOD_STEP)), json.dumps(GOOD_STEP)]
        texts[which] = "\n".join(lines) + "\n"
    else:
        texts[which] = data.draw(mutated(json.loads(texts[which])))
    for name, text in texts.items():
        (run / name).write_text(text)
    run_compare(place, "run", "--calibrate", "bench.json", "--layer-profile", "profile.json", "--cores", "2")


@SETTINGS
@given(data=st.data())
def test_bench_files_for_calibrate(place, data):
    (place / "b.json").write_text(data.draw(mutated(GOOD_BENCH)))
    run_cli(place, "plan", "calibrate", "b.json", "--grid", "2x2")


@SETTINGS
@given(kind=st.sampled_from(["step", "layers"]), data=st.data())
def test_profiles(place, kind, data):
    good = GOOD_PROFILE if kind == "step" else GOOD_PROFILE["modules"]
    (place / "p.json").write_text(data.draw(mutated(good)))
    if kind == "layers":
        run_cli(place, "plan", "--gpus", "8", "--grid", "2x4", "--model", "resnet18", "--layer-profile", "p.json")
    else:  # a step profile is read by compare_run.py
        (place / "run").mkdir(exist_ok=True)
        for name, doc in (("job.json", GOOD_JOB), ("summary.json", GOOD_SUMMARY)):
            (place / "run" / name).write_text(json.dumps(doc))
        (place / "run" / "metrics.jsonl").write_text(json.dumps(GOOD_STEP) + "\n")
        run_compare(place, "run", "--calibrate", "bench.json", "--layer-profile", "p.json", "--cores", "2")


HOST_LINES = st.one_of(
    st.builds(
        lambda h, k: f"{h} slots={k}",
        st.sampled_from(["localhost", "node1", "n-2.x", "", "a b"]),
        st.one_of(st.integers(-2, 10**12).map(str), st.text(max_size=4)),
    ),
    st.text(max_size=30),
    st.sampled_from(["# comment", "", "localhost", "localhost slots=", "slots=2"]),
)


@SETTINGS
@given(lines=st.lists(HOST_LINES, max_size=5), raw=st.binary(max_size=20), use_raw=st.booleans())
def test_hostfiles(place, lines, raw, use_raw):
    f = place / "hosts"
    f.write_bytes(raw if use_raw else "\n".join(lines).encode("utf-8", "surrogatepass"))
    run_cli(
        place, "run", "--dry-run", "--data", "synthetic", "--launcher", "mpirun", "--hostfile", "hosts", "--out", "o"
    )


@pytest.fixture(scope="module")
def dataplace(tmp_path_factory):
    d = tmp_path_factory.mktemp("idx")
    make_index_set(d / "d", n_train=6, n_val=3)
    (d / "notes").mkdir()
    (d / "notes" / "todo.txt").write_text("mine")
    (d / "file.txt").write_text("a file")
    os.symlink("notes", d / "link")
    return d


PARTS = st.sampled_from(["..", ".", "d", "train", "val", "c0", "notes", "file.txt", "link", "new", "idx", "", "x\\y"])


@SETTINGS
@given(parts=st.lists(PARTS, min_size=1, max_size=4))
def test_index_targets(dataplace, parts):
    target = "/".join(parts)
    with contextlib.chdir(dataplace):
        # an empty --index means the default place, as data.index = "" does
        written = Path(target).resolve() if target else (dataplace / "d" / ".torus-train-index").resolve()
        before = tree_digest(dataplace.resolve(), exclude=written, folders=False)
        code, _, err = invoke("data", "index", "--data", "d", "--index", target)
    COUNT["examples"] += 1
    assert "Traceback" not in err and code in (0, 2), err
    if code == 2:
        COUNT["exit2"] += 1
        assert err.count("\n") == 1 and err.startswith("torus-train: error:"), err
        assert tree_digest(dataplace.resolve(), exclude=written, folders=False) == before
        return
    COUNT["exit0"] += 1
    assert (written / "meta.json").is_file()
    data = (dataplace / "d").resolve()
    for split in ("train", "val"):  # never among the images
        assert data / split not in (written, *written.parents)
    # only the index's own folder changed (and the folders above it, made for it)
    assert tree_digest(dataplace.resolve(), exclude=written, folders=False) == before
