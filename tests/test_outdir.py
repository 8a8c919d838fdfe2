"""Writers never delete what they did not write: `data index` (the CLI, in process) over every kind of target.
A target that is absent, empty or an older index is written; a file, a foreign folder, the data folder itself
or a place inside its train/ or val/ is refused in one line (exit 2) and left byte for byte as it was."""

from __future__ import annotations

import os

import pytest
from clihelp import assert_one_line_error, invoke, tree_digest
from datahelp import make_index_set

from torus_train.outdir import FolderKind, write_folder


def index(data, target, cwd=None):
    args = ["data", "index", "--data", str(data)] + ([] if target is None else ["--index", str(target)])
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return invoke(*args)
    finally:
        os.chdir(old)


@pytest.fixture()
def data(tmp_path):
    return make_index_set(tmp_path / "d", n_train=12, n_val=6)


def refused(result, *words):
    code, _, err = result
    assert_one_line_error(code, err)
    for w in words:
        assert w in err, err
    return err


def test_absent_empty_and_older_index_are_written(data, tmp_path):
    for target in (tmp_path / "new" / "idx", tmp_path / "empty"):
        if target.name == "empty":
            target.mkdir()
        assert index(data, target)[0] == 0
        assert (target / "meta.json").is_file()
    first = (tmp_path / "empty" / "meta.json").read_bytes()
    assert index(data, tmp_path / "empty")[0] == 0  # an older index of ours is replaced
    assert (tmp_path / "empty" / "meta.json").read_bytes() != b"" and first
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name or ".old-" in p.name]


@pytest.mark.parametrize(
    "case",
    ["notes-folder", "file", "symlink", "data-itself", "train", "inside-train", "inside-val", "parent-of-data", "dot"],
)
def test_foreign_targets_are_refused_untouched(data, tmp_path, case):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    (tmp_path / "file.txt").write_text("a file")
    os.symlink(notes, tmp_path / "link")
    target, cwd, words = {
        "notes-folder": (notes, None, ["--index", "not a data index", "untouched"]),
        "file": (tmp_path / "file.txt", None, ["--index", "a file is there"]),
        "symlink": (tmp_path / "link", None, ["--index", "not a data index"]),
        "data-itself": (data, None, ["--index", "holds the data folder"]),
        "train": (data / "train", None, ["--index", "train/"]),
        "inside-train": (data / "train" / "c0" / "idx", None, ["--index", "train/"]),
        "inside-val": (data / "val" / "new", None, ["--index", "val/"]),
        "parent-of-data": (tmp_path, None, ["--index", "holds the data folder"]),
        "dot": (".", notes, ["--index", "not a data index"]),
    }[case]
    before = tree_digest(tmp_path)
    refused(index(data, target, cwd), *words)
    assert tree_digest(tmp_path) == before


def test_a_failed_fill_leaves_no_partial_and_keeps_the_old_folder(tmp_path):
    kind = FolderKind("thing", "meta.json", lambda m: m.get("kind") == "thing", lambda m: ())
    target = tmp_path / "t"
    write_folder(target, kind, "--out", lambda p: (p / "meta.json").write_text('{"kind": "thing", "n": 1}'))

    def broken(p):
        (p / "half").write_text("x")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_folder(target, kind, "--out", broken)
    assert (target / "meta.json").read_text() == '{"kind": "thing", "n": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_symlink_loop_and_non_utf8_names_are_named(tmp_path):
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    line = refused(index(loop, tmp_path / "i1"))
    assert "loop" in line
    d = make_index_set(tmp_path / "d", n_train=6, n_val=3)
    os.rename(d / "train" / "c0", os.fsencode(d / "train") + b"/bad\xff")
    line = refused(index(d, tmp_path / "i2"), "not valid UTF-8", "bad\\xff")
