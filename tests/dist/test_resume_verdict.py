"""Resume at scale: one rank per node reads and verifies the checkpoint and hands it to its node's ranks; every
rank gets the same verdict."""

import json
import sys
from pathlib import Path

import pytest
import torch

from torus_train.ranks.bootstrap import free_port
from torus_train.ranks.localrun import run_local_ranks
from torus_train.train.checkpoint import save_checkpoint

WORKER = str(Path(__file__).with_name("resume_worker.py"))


def _save(folder, step):
    save_checkpoint(
        folder,
        step,
        {"model": {"w": torch.full((256,), float(step))}, "position": {"global_step": step}},
        {"epoch": 0},
        keep=9,
    )


@pytest.mark.timeout(240)
def test_node_leaders_verify_and_every_rank_agrees(tmp_path):
    for step in (3, 6, 9):
        _save(tmp_path / "shared", step)
    pt = tmp_path / "shared" / "step-00000009.pt"
    data = bytearray(pt.read_bytes())
    data[-5] ^= 0xFF  # the newest one is corrupt: leaders skip it
    pt.write_bytes(bytes(data))
    _save(tmp_path / "stale", 3)
    (tmp_path / "empty").mkdir()
    out = tmp_path / "checks"
    port = str(free_port())
    envs = [
        {
            "RANK": str(r),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(r % 2),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_PORT": port,
            "CKPTS": str(tmp_path),
            "CHECK_OUT": str(out),
            "OMP_NUM_THREADS": "1",
        }
        for r in range(4)
    ]
    run_local_ranks([[sys.executable, WORKER]] * 4, envs, what="resume verdict check")
    got = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(4)]
    # only the node leaders (ranks 0 and 2) hash, each the corrupt step 9 and then step 6; all load step 6
    assert [g["shared"]["chosen"] for g in got] == [6] * 4
    assert [g["shared"]["hashed"] for g in got] == [
        ["step-00000009.pt", "step-00000006.pt"],
        [],
        ["step-00000009.pt", "step-00000006.pt"],
        [],
    ]
    # one read per node: the leaders read the corrupt step 9 and step 6 once each, their node's ranks nothing
    sizes = {s: (tmp_path / "shared" / f"step-{s:08d}.pt").stat().st_size for s in (6, 9)}
    assert [g["shared"]["bytes_read"] for g in got] == [sizes[9] + sizes[6], 0, sizes[9] + sizes[6], 0]
    # a node that sees another checkpoint: every rank refuses, naming the first leader that disagrees
    assert all(g["stale"]["chosen"].startswith("refused: resume: the node of rank 2 does not see") for g in got)
    assert [g["empty"]["chosen"] for g in got] == [None] * 4
