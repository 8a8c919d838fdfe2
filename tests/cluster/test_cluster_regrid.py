"""Stages that grow the grid on the namespace cluster: epoch 0 on 1 node x 2 ranks (grid 2x1), then epoch 1 on
2 nodes x 2 ranks (grid 2x2) from the checkpoint the first leg wrote, through mpirun and a hostfile."""

from __future__ import annotations

import json

import pytest

from tests.cluster.conftest import ROOT

TINY = str(ROOT / "tests" / "cluster" / "tiny.toml")
STAGES = 'schedule.stages=[{until_epoch=1,global_batch=32,grid="2x1"},{until_epoch=2,global_batch=64,grid="2x2"}]'


@pytest.mark.timeout(240)
def test_one_node_then_two(cluster, tmp_path):
    out = tmp_path / "run"
    hf = cluster.hostfile(tmp_path / "hosts")
    r = cluster.on(
        "node1",
        "torus-train",
        "run",
        "--spec",
        TINY,
        "--launcher",
        "mpirun",
        "--hostfile",
        str(hf),
        "--out",
        str(out),
        "--epochs",
        "2",
        "--set",
        "schedule.steps=0",
        "--set",
        STAGES,
        "--set",
        "data.synthetic_samples=64",
        timeout=230,
        env={"OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mpirun --allow-run-as-root -np 2 --map-by ppr:2:node" in r.stdout  # leg 1: node1 only
    assert "mpirun --allow-run-as-root -np 4 --map-by ppr:2:node" in r.stdout  # leg 2: both nodes
    assert "grid stage: epochs 1-2 on 4 ranks, grid 2x2, from the checkpoint at step 2" in r.stdout
    assert "resuming step 2 of grid 2x1 (2 ranks) on grid 2x2 (4 ranks)" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert (s["world_size"], s["grid"], s["steps"], s["epochs_done"], s["param_digests_agree"]) == (
        4,
        "2x2",
        3,
        2,
        True,
    )
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "loss" in m and "step" in m]
    assert [(m["step"], m["epoch"], m["global_batch"]) for m in steps] == [(1, 0, 32), (2, 0, 32), (3, 1, 64)]
