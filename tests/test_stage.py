"""data.stage = node (data/stage.py): the packed set copied to node-local space and checked, a valid copy
reused, a stale one replaced, a node without room refused in one line naming both sizes."""

from __future__ import annotations

import re
import shutil
from collections import namedtuple

import pytest
from datahelp import make_index_set

from torus_train.data.packed import load_packed, pack
from torus_train.data.stage import stage, stage_on_node, stage_target, valid_copy
from torus_train.errors import UserError
from torus_train.job.stagedir import stage_base


@pytest.fixture()
def shards(tmp_path):
    return pack(make_index_set(tmp_path / "d", n_train=12, n_val=3, size=16), tmp_path / "s", shard_mb=0.01)


def test_copy_then_reuse(shards, tmp_path):
    base = tmp_path / "local"
    said = []
    target = stage(shards, base, said.append)
    assert target == stage_target(shards, base) and valid_copy(target, load_packed(shards))
    load_packed(target).verify()
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in shards.iterdir())
    mtime = (target / "train-000000.tar").stat().st_mtime_ns
    assert stage(shards, base, said.append) == target
    assert (target / "train-000000.tar").stat().st_mtime_ns == mtime  # reused, not copied again
    assert "copied" in said[0] and "reusing" in said[1]


def test_stale_copy_is_replaced(shards, tmp_path):
    base = tmp_path / "local"
    target = stage(shards, base)
    (target / "train-000001.tar").write_bytes(b"short")  # a node whose copy was cut
    assert not valid_copy(target, load_packed(shards))
    stage(shards, base)
    assert valid_copy(target, load_packed(shards))
    pack(tmp_path / "d", shards, shard_mb=0.02)  # the set packed again: another checksum, the copy is stale
    assert not valid_copy(target, load_packed(shards))
    stage(shards, base)
    assert valid_copy(target, load_packed(shards)) and not list(base.glob("torus-train-stage/.*"))


def test_no_room_is_one_line_with_both_sizes(shards, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(UserError) as e:
        stage(shards, tmp_path / "local")
    msg = str(e.value)
    assert "\n" not in msg and "has 0.0 MB free, the packed set needs 0." in msg and "MB" in msg
    assert not (tmp_path / "local" / "torus-train-stage").exists() or not any(
        (tmp_path / "local" / "torus-train-stage").iterdir()
    )


def test_where_and_what(shards, tmp_path):
    assert stage_base("", {"TMPDIR": "/t", "SLURM_TMPDIR": "/s"}) == stage_base("/s", {})
    assert str(stage_base("", {"PBS_JOBFS": "/p", "TMPDIR": "/t"})) == "/p"
    with pytest.raises(UserError, match=re.escape("no node-local folder; set data.stage_dir")):
        stage_base("", {})
    with pytest.raises(UserError, match="needs a packed set"):
        stage(tmp_path / "d", tmp_path / "local")
    waited = []
    got = stage_on_node(shards, str(tmp_path / "local"), 0, lambda: waited.append(1))
    assert waited == [1] and valid_copy(got, load_packed(shards))
    assert stage_on_node(shards, str(tmp_path / "local"), 1, lambda: None) == got  # other ranks read it
