"""scripts/bench/cluster_vs_plan.py past two nodes: 4 namespace nodes of 2 ranks, tbf-shaped links, one size (16 MiB,
where the links decide), gloo, flat and torus (the full run, with hierarchical and mpi, is docs/cluster.md
section 7).

The session's 2-node cluster (conftest) and this 4-node one cannot exist at once: if the 2-node cluster is up,
the test takes it down, runs, and brings it back (same node names and addresses) for the tests after it."""

import json
import subprocess
import sys

import pytest

from tests.cluster.conftest import CLUSTER, ROOT, STATE, _why_not


@pytest.fixture
def no_cluster_up():
    why = _why_not()
    was_up = why.startswith("a namespace cluster is already up")
    if why and not was_up:
        pytest.skip(why)
    if was_up:
        subprocess.run([str(CLUSTER), "down"], capture_output=True, text=True, timeout=90)
    try:
        yield
    finally:
        if was_up:
            r = subprocess.run([str(CLUSTER), "up", "2"], capture_output=True, text=True, timeout=90)
            assert r.returncode == 0, r.stderr


@pytest.mark.timeout(420)
def test_four_nodes_bench_against_the_plan_calibrated_on_two(no_cluster_up, tmp_path):
    out = tmp_path / "cvp.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench" / "cluster_vs_plan.py"),
            "--nodes",
            "4",
            "--no-lock",
            "--backends",
            "gloo",
            "--algos",
            "flat,torus",
            "--sizes-mib",
            "16",
            "--iters",
            "3",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert not (STATE / "nodes").exists(), "the 4-node cluster was not torn down"
    rows = json.loads(out.read_text())
    algos = ("flat", "torus")
    assert {(x["nodes"], x["algo"]) for x in rows} == {(n, a) for n in (2, 4) for a in algos}
    for x in rows:
        assert {"nodes", "algo", "backend", "bytes", "measured_s", "predicted_s"} <= set(x)
        assert x["backend"] == "gloo" and x["bytes"] == 16 << 20 and x["measured_s"] > 0 and x["predicted_s"] > 0
    # calibrated on 2 nodes, the 4-node rows at 16 MiB are predicted within 0.89-1.08 in every recorded run
    # (docs/cluster.md, third pass); the band here leaves room for 3 iterations on a busy CI host
    for x in rows:
        if x["nodes"] == 4:
            assert 0.6 < x["predicted_s"] / x["measured_s"] < 1.6, x
    assert "measured flat/torus" in r.stdout
