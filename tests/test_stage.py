"""data.stage = node (data/stage.py): the packed set copied to node-local space and checked, a valid copy
reused, a stale one replaced, a node without room refused in one line naming both sizes; the wait for every
node's copy on a store (torch's HashStore, ranks as threads): released by the last node, a failed copy named
on every rank, a timeout naming the nodes still copying. tests/dist/test_stage_dist.py runs it on gloo."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections import namedtuple
from pathlib import Path

import pytest
from datahelp import make_index_set

from torus_train.data.packed import load_packed
from torus_train.data.packer import pack
from torus_train.data.stage import NodesWait, stage, stage_key, stage_on_node, stage_target, valid_copy
from torus_train.errors import RunFailed, UserError
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
    got = stage_on_node(shards, str(tmp_path / "local"), 0)  # a rank alone: no wait
    assert valid_copy(got, load_packed(shards))
    assert stage_on_node(shards, str(tmp_path / "local"), 1) == got  # other ranks read it


def ranks_staging(store, nodes: int, per_node: int, copy_s: dict, timeout_s: float, fail: int = -1) -> dict:
    """Every rank of ``nodes`` x ``per_node`` as a thread through NodesWait.around; node n's leader copies for
    copy_s[n] seconds (node ``fail``'s copy raises). {rank: None, or the error it raised}."""
    got: dict = {}

    def rank(r: int) -> None:
        node, local = divmod(r, per_node)

        def copy() -> None:
            time.sleep(copy_s.get(node, 0.0))
            if node == fail:
                raise UserError("node-local disk full")

        w = NodesWait(store, stage_key("/shards"), r, local, per_node, nodes * per_node, timeout_s, f"n{node}")
        try:
            w.around(copy if local == 0 else None)
            got[r] = None
        except (RunFailed, UserError) as e:
            got[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(nodes * per_node)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return got


@pytest.mark.timeout(60)
def test_every_rank_waits_for_the_slowest_node_then_goes_on():
    from torch.distributed import HashStore

    t0 = time.monotonic()
    got = ranks_staging(HashStore(), 3, 2, {1: 1.0}, timeout_s=20)
    assert got == dict.fromkeys(range(6)) and 1.0 <= time.monotonic() - t0 < 15


@pytest.mark.timeout(60)
def test_a_failed_copy_wakes_every_rank_naming_the_node():
    from torch.distributed import HashStore

    got = ranks_staging(HashStore(), 2, 2, {0: 0.5}, timeout_s=20, fail=1)
    assert isinstance(got[2], UserError)  # the leader's own error
    for r in (0, 1, 3):
        assert isinstance(got[r], RunFailed)
        assert str(got[r]) == "data.stage: the node n1 (rank 2) failed to stage: node-local disk full"


@pytest.mark.timeout(60)
def test_a_timeout_names_the_nodes_still_copying():
    from torch.distributed import HashStore

    got = ranks_staging(HashStore(), 3, 2, {1: 4.0, 2: 4.0}, timeout_s=1.5)
    head = "data.stage: after data.stage_timeout_s = 1.5 s the nodes of 2 of 6 ranks had copied the packed set"
    late = {r: str(got[r]) for r in (0, 1, 3, 5)}  # the slow leaders (2, 4) copy on and find every copy done
    assert got[2] is None and got[4] is None
    named = [r for r, m in late.items() if "still copying:" in m]
    assert len(named) == 1  # one rank asks the store about every node, not each rank
    assert late[named[0]] == f"{head}; still copying: n1 (rank 2), n2 (rank 4); raise data.stage_timeout_s"
    for r, m in late.items():
        assert r in named or m == f"{head}; rank {named[0]}'s log names those still copying", m


def test_on_the_fake_backend_a_rank_stages_without_waiting(shards, tmp_path, caplog):
    """A full-world rehearsal plays one rank on torch's fake backend, whose store answers without holding
    anything: staging copies and goes on, saying so, instead of waiting out data.stage_timeout_s."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torus_train.job.rank import Bootstrap, RankInfo
    from torus_train.job.spec import load_spec
    from torus_train.job.topology import parse_grid
    from torus_train.train import build

    sets = [("data.stage", "node"), ("data.stage_dir", str(tmp_path / "local")), ("data.stage_timeout_s", 30.0)]
    spec = load_spec(None, [("data.source", str(shards)), *sets])
    info = RankInfo(1088, 2176, 0, 4, "test")
    dist.init_process_group("fake", store=FakeStore(), rank=info.rank, world_size=info.world_size)
    try:
        boot = Bootstrap(info, parse_grid("32x68", 4), torch.device("cpu"), "fake", None)
        t0 = time.monotonic()
        with caplog.at_level("INFO", logger="torus_train.train"):
            root = build.staged_root(spec, boot, str(shards))
        assert time.monotonic() - t0 < 10 and valid_copy(Path(root), load_packed(shards))
        assert "not waiting for the other nodes" in caplog.text
    finally:
        dist.destroy_process_group()
        build._staged.clear()
