"""comm/consensus.py on 4 real gloo ranks: every rank gets the same verdict, the count of failing ranks, and the
reason of the lowest failing rank (broadcast from it), whichever ranks failed; and outside a process group a
rank's own verdict."""

import json
import sys
from pathlib import Path

import pytest
import torch

from torus_train.comm.consensus import Consensus, consensus
from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks

WORKER = str(Path(__file__).with_name("consensus_worker.py"))


def verdicts(tmp_path: Path, failing: dict[int, str], world: int = 4) -> list[dict]:
    port = str(free_port())
    base = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "CHECK_OUT": str(tmp_path)}
    fails = {f"FAIL_{r}": why for r, why in failing.items()}
    envs = [{**base, **fails, "RANK": str(r), "OMP_NUM_THREADS": "1"} for r in range(world)]
    run_local_ranks([[sys.executable, WORKER]] * world, envs, what="consensus check")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "failing, want",
    [
        ({}, {"ok": True, "where": "on 0 of 4 ranks", "reason": "", "first": None}),
        (
            {3: "mean 40 levels"},
            {"ok": False, "where": "on 1 of 4 ranks", "reason": "rank 3: mean 40 levels", "first": 3},
        ),
        (
            {2: "capture raised", 1: "replay differed"},
            {"ok": False, "where": "on 2 of 4 ranks", "reason": "rank 1: replay differed", "first": 1},
        ),
    ],
)
def test_every_rank_gets_the_first_failing_ranks_reason(tmp_path, failing, want):
    assert verdicts(tmp_path, failing) == [want] * 4


def test_outside_a_process_group_a_rank_has_its_own_verdict():
    assert consensus(None, torch.device("cpu")) == Consensus(0, 1, None, None)
    alone = consensus("no CUDA device", torch.device("cpu"))
    assert (alone.ok, alone.where(), alone.reason()) == (False, "here", "no CUDA device")
