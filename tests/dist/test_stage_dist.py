"""data.stage = node on 4 real gloo ranks as 2 nodes: one node's copy takes longer than the process group's
timeout and the run goes on (every rank waits on the rendezvous store, bounded by data.stage_timeout_s, not in
a collective); a copy past data.stage_timeout_s fails every rank, rank 0 naming the node still copying."""

import json
import sys
from pathlib import Path

import pytest

from torus_train.data.packer import pack
from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for datahelp
from datahelp import make_index_set

WORKER = str(Path(__file__).with_name("stage_worker.py"))
WORLD = 4


def staging(tmp_path: Path, slow_s: float, comm_timeout_s: float, stage_timeout_s: float) -> list[dict]:
    shards = pack(make_index_set(tmp_path / "d", n_train=12, n_val=3, size=16), tmp_path / "s", shard_mb=0.01)
    out = tmp_path / "out"
    out.mkdir()
    base = {
        "WORLD_SIZE": str(WORLD),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "STAGE_OUT": str(out),
        "SHARDS": str(shards),
        "SLOW_NODE": "1",
        "SLOW_S": str(slow_s),
        "COMM_TIMEOUT_S": str(comm_timeout_s),
        "STAGE_TIMEOUT_S": str(stage_timeout_s),
        "OMP_NUM_THREADS": "1",
    }
    envs = [{**base, "RANK": str(r)} for r in range(WORLD)]
    run_local_ranks([[sys.executable, WORKER]] * WORLD, envs, what="staging check")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.timeout(150)
def test_a_copy_slower_than_the_collective_timeout_passes(tmp_path):
    # node 1's copy takes 6 s, twice the 3 s collective timeout, inside the 60 s staging limit
    ranks = staging(tmp_path, slow_s=6.0, comm_timeout_s=3.0, stage_timeout_s=60.0)
    for r in ranks:
        assert "error" not in r, r
        assert r["sum"] == 0 + 1 + 2 + 3 and r["waited_s"] >= 5.5
        assert Path(r["root"]).parent.parent.name == f"node{r['rank'] // 2}"  # each node reads its own copy


@pytest.mark.timeout(150)
def test_a_copy_past_the_staging_limit_names_the_node(tmp_path):
    ranks = staging(tmp_path, slow_s=5.0, comm_timeout_s=3.0, stage_timeout_s=1.5)
    head = "RunFailed: data.stage: after data.stage_timeout_s = 1.5 s the nodes of 2 of 4 ranks had copied"
    errors = {r: ranks[r]["error"] for r in (0, 1, 3)}  # rank 2, node 1's leader, is the one still copying
    assert all(e.startswith(head) for e in errors.values()), errors
    named = [r for r, e in errors.items() if "; still copying: " in e]
    assert len(named) == 1 and errors[named[0]].endswith(" (rank 2); raise data.stage_timeout_s"), errors
    for r, e in errors.items():
        assert r in named or e.endswith(f"rank {named[0]}'s log names those still copying"), e
