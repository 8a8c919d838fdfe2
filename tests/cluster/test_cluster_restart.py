"""--max-restarts under srun on the namespace cluster: rank 3 (on node2) is SIGKILLed mid-run; srun ends the
step (--kill-on-bad-exit) and names the task; the launcher starts a new step in the same allocation from the
latest checkpoint and the job finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.cluster.conftest import CLUSTER, ROOT

TINY = str(ROOT / "tests" / "cluster" / "tiny.toml")


def beat(out, rank: int) -> dict | None:
    try:
        return json.loads((out / "logs" / f"rank{rank:05d}.beat").read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.timeout(240)
def test_a_killed_rank_is_restarted_in_a_new_srun_step(cluster, tmp_path):
    out = tmp_path / "run"
    argv = [
        str(CLUSTER),
        "exec",
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
        "schedule.steps=8",
        "--set",
        "checkpoint.every_steps=2",
        "--max-restarts",
        "1",
    ]
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.time() + 150
        while not ((b := beat(out, 3)) and b["step"] >= 3):
            if time.time() > deadline or p.poll() is not None:
                queue = cluster.on("node1", "squeue", "-o", "%i %T %R %D %N", timeout=20).stdout
                nodes = cluster.on("node1", "sinfo", "-N", "-o", "%N %t %E", timeout=20).stdout
                pytest.fail(f"the run did not start training\nsqueue:\n{queue}\nsinfo:\n{nodes}")
            time.sleep(0.1)
        os.kill(b["pid"], signal.SIGKILL)  # the nodes share this machine's process namespace
        stdout, stderr = p.communicate(timeout=200)
    finally:
        if p.poll() is None:
            p.kill()
    print(next((ln for ln in stderr.splitlines() if "restart 1 of 1" in ln), "no restart line"))
    assert p.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert (
        "rank 3 on node2 was killed by SIGKILL" in stderr and "restart 1 of 1 from the checkpoint at step" in stderr
    ), stderr[-3000:]
    assert stdout.count("$ ") == 2 and "srun --nodes=2 --ntasks=4" in stdout
    s = json.loads((out / "summary.json").read_text())
    assert (s["world_size"], s["steps"], s["param_digests_agree"]) == (4, 8, True)
