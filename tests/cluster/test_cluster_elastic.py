"""--elastic on the namespace cluster: rank 3 (on node2) is killed after step 3 in every attempt; after the
restart fails the same way, node2 leaves the hostfile and the job finishes on node1 alone (grid 2x1), through
mpirun, with the global batch kept by accumulation."""

from __future__ import annotations

import json

import pytest

from tests.cluster.conftest import ROOT

TINY = str(ROOT / "tests" / "cluster" / "tiny.toml")


@pytest.mark.timeout(300)
def test_a_node_lost_for_good_is_left_out(cluster, tmp_path):
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
        "--set",
        "schedule.steps=6",
        "--set",
        "checkpoint.every_steps=2",
        "--set",
        'launch.env=["TORUS_TRAIN_FAULT"]',
        "--max-restarts",
        "2",
        "--elastic",
        timeout=290,
        env={"TORUS_TRAIN_FAULT": "step:3:3", "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "rank 3 on node2 was killed by SIGKILL" in r.stderr and "restart 1 of 2" in r.stderr, r.stderr[-3000:]
    assert (
        "node 1 (ranks 2-3, host node2) failed in two attempts in a row: continuing without it on 2 ranks, "
        "grid 2x1; the global batch stays 64 (2 ranks x 16 x 2 accumulated)"
    ) in r.stderr, r.stderr[-3000:]
    assert (out / "hosts.elastic").read_text() == "node1 slots=2\n"
    assert f"-np 2 --map-by ppr:2:node --bind-to none --hostfile {out / 'hosts.elastic'}" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert (s["world_size"], s["grid"], s["steps"], s["param_digests_agree"]) == (2, "2x1", 6, True)


@pytest.mark.timeout(300)
def test_a_node_lost_for_good_is_left_out_under_srun(cluster, tmp_path):
    """The same inside a Slurm allocation of 2 nodes: srun names the task, the next step runs on node1 alone
    (--nodes=1 --nodelist=node1)."""
    out = tmp_path / "run"
    r = cluster.on(
        "node1",
        "salloc",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "torus-train",
        "run",
        "--spec",
        TINY,
        "--launcher",
        "srun",
        "--out",
        str(out),
        "--set",
        "schedule.steps=6",
        "--set",
        "checkpoint.every_steps=2",
        "--max-restarts",
        "2",
        "--elastic",
        timeout=290,
        env={"TORUS_TRAIN_FAULT": "step:3:3", "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "rank 3 on node2 was killed by SIGKILL" in r.stderr and "restart 1 of 2" in r.stderr, r.stderr[-3000:]
    assert "node 1 (ranks 2-3, host node2) failed in two attempts in a row" in r.stderr, r.stderr[-3000:]
    assert "srun --nodes=1 --ntasks=2 --ntasks-per-node=2" in r.stdout and "--nodelist=node1" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert (s["world_size"], s["grid"], s["steps"], s["param_digests_agree"]) == (2, "2x1", 6, True)
