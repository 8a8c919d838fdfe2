"""scripts/bench/bench_hook.py --cluster: the hook comparison with its jobs and its timeline ranks on two nodes."""

import json
import subprocess
import sys

import pytest

from tests.cluster.conftest import ROOT


@pytest.mark.slow
def test_hook_bench_runs_its_jobs_and_timeline_on_the_nodes(cluster, tmp_path):
    hosts = cluster.hostfile(tmp_path / "hosts", slots=2)
    out = tmp_path / "hook.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench" / "bench_hook.py"),
            "--grid",
            "2x2",
            "--rounds",
            "1",
            "--steps",
            "10",
            "--hooks",
            "torus-sync,torus-async",
            "--timeline-step",
            "1",
            "--cluster",
            str(hosts),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [row["hook"] for row in result["results"]] == ["torus-sync", "torus-async"]
    assert all(row["images_per_s"] > 0 for row in result["results"])
    assert all(run["digests_agree"] for run in result["runs"])
    assert result["link"].startswith("namespace cluster")
    timeline = json.loads((tmp_path / "hook-timeline.json").read_text())
    assert set(timeline["hooks"]) == {"torus-sync", "torus-async"}
    for hook in timeline["hooks"].values():
        assert hook["buckets"], "no bucket was timed"
        assert all(b["ready"] <= b["start"] <= b["end"] for b in hook["buckets"])
