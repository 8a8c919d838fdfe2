"""The graph probe's verdict is the same on every rank (train/graphs.py: comm/consensus.py after the capture
and after the comparison): on 2 gloo ranks where only one rank's capture fails, or only one rank's replay
differs, both ranks go on eagerly, neither replays a graph the other does not (a replay holds the exchange's
collectives: a lone one would hang), every rank names the failing rank and its reason, and the replicas end
equal."""

import json
import sys
from pathlib import Path

import pytest

from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("graph_probe_worker.py"))


def run(tmp_path: Path, fail: str, fail_rank: int) -> list[dict]:
    port = str(free_port())
    envs = [
        {
            "RANK": str(r),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "CHECK_OUT": str(tmp_path),
            "FAIL": fail,
            "FAIL_RANK": str(fail_rank),
            "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
        }
        for r in range(2)
    ]
    run_local_ranks([[sys.executable, WORKER]] * 2, envs, what="graph probe check")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fail, fail_rank", [("capture", 1), ("mismatch", 0)])
def test_one_ranks_failure_makes_every_rank_eager(tmp_path, fail, fail_rank):
    ranks = run(tmp_path, fail, fail_rank)
    for r in ranks:
        assert r["choice"]["choice"] == "eager", r
        assert len(r["said"]) == 1 and "goes on with the eager step" in r["said"][0], r
        # replays: none after a failed capture on any rank; exactly the probe's one after a mismatch
        assert r["log"].count("replay") == (0 if fail == "capture" else 1), r["log"]
    why = "capture failed" if fail == "capture" else "differed from the eager step"
    assert why in ranks[fail_rank]["said"][0]
    # every rank names the rank that failed and its reason, the one whose own check passed too
    if fail == "capture":
        why = f"capture failed on rank {fail_rank} (CUDA error: operation not permitted when stream is capturing)"
    else:
        why = f"differed from the eager step on rank {fail_rank} by max relative difference"
    assert all(why in r["said"][0] and why in r["choice"]["why"] for r in ranks), ranks
    assert ranks[0]["digest"] == ranks[1]["digest"]
