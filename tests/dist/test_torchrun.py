"""`torchrun ... -m torus_train run`: torchrun starts the ranks and each becomes one rank of the job (rank info
from torchrun's variables), and `torchrun --max-restarts` continues a job from its latest checkpoint. Real
torchrun (torch.distributed.run of this Python), real gloo ranks, hard time guards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from .runhelp import metrics, run_cli, summary
from .test_restarts import COMMON, kill_rank_after

pytestmark = pytest.mark.timeout(300)

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def torchrun(*args: str) -> list[str]:
    return [*TORCHRUN, *args, "-m", "torus_train", "run"]


def test_torchrun_starts_the_ranks_of_a_run(tmp_path):
    out = tmp_path / "run"
    r = run_cli(*COMMON[:-2], "--out", str(out), cmd=torchrun(), env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    s = summary(out)
    assert (s["world_size"], s["steps"], s["param_digests_agree"]) == (2, 10, True)
    assert "(local 1, from torchrun)" in (out / "logs" / "rank00001.log").read_text()


@pytest.mark.slow
def test_torchrun_max_restarts_continues_from_the_latest_checkpoint(tmp_path):
    """Rank 1 killed at step >= 4 (a checkpoint every 2 steps); torchrun's agent stops the other and starts
    both again: the second attempt resumes the folder (rank 0 does not prepare it anew) and meets in a key
    space of its own in the agent's store (without it a rank could read the first attempt's addresses)."""
    straight, restarted = tmp_path / "straight", tmp_path / "restarted"
    r = run_cli(*COMMON, "--out", str(straight), timeout=150)
    assert r.returncode == 0, r.stderr
    argv = [*torchrun("--max-restarts", "1"), *COMMON, "--out", str(restarted)]
    code, stdout, stderr, _ = kill_rank_after(argv, restarted, 4, env={"OMP_NUM_THREADS": "1"})
    assert code == 0, stdout + stderr
    assert "resumed at epoch 0, step " in stdout
    s = summary(restarted)
    assert (s["steps"], s["param_digests_agree"]) == (10, True)
    assert s["param_digest"] == summary(straight)["param_digest"], "the restarted job ended with other parameters"
    assert not list((restarted / "logs").glob("*.failed")), "a mark of the first attempt speaks for the second"
    steps = [m["step"] for m in metrics(restarted) if "loss" in m]
    assert steps == sorted(set(steps)), f"metrics.jsonl holds a step twice: {steps}"


def test_a_restarted_rank_meets_its_peers_in_a_key_space_of_its_attempt(monkeypatch):
    """The rendezvous each attempt uses (ranks/distributed.py): rank 0's address on the first attempt or
    outside torchrun; the agent's store under a prefix of the attempt after a torchrun restart."""
    import torch.distributed as dist

    from torus_train.job.rank import RankInfo
    from torus_train.ranks import distributed

    made = []
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: made.append((a, k)) or dist.HashStore())
    info = RankInfo(1, 2, 1, 2, "torchrun")
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    timeout = timedelta(seconds=5)
    first = distributed._meeting_point(info, {**env, "TORCHELASTIC_RESTART_COUNT": "0"}, timeout)
    assert first == {"init_method": "tcp://10.0.0.1:29500"} and not made
    own_store = distributed._meeting_point(
        info, {**env, "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_USE_AGENT_STORE": "False"}, timeout
    )
    assert own_store == {"init_method": "tcp://10.0.0.1:29500"} and not made
    later = distributed._meeting_point(info, {**env, "TORCHELASTIC_RESTART_COUNT": "2"}, timeout)
    assert isinstance(later["store"], dist.PrefixStore) and made[0][0][:2] == ("10.0.0.1", 29500)
    assert made[0][1]["is_master"] is False
    later["store"].set("k", "v")
    assert later["store"].underlying_store.get("torus-train/attempt2/k") == b"v"


def test_sigterm_to_torchrun_stops_the_ranks_with_a_checkpoint(tmp_path):
    """torchrun's agent passes a SIGTERM (a scheduler's, or Ctrl-C) to each rank's whole process group, the
    torchvision loader's worker processes included: they leave the stop to the rank, which agrees it with the
    others and checkpoints (a worker ended by the signal used to fail the rank first, with no checkpoint)."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from datahelp import make_index_set

    data = make_index_set(tmp_path / "data", n_train=96, n_val=12, size=32)
    out = tmp_path / "run"
    args = [*COMMON[:-4], "--data", str(data), "--set", "model.num_classes=3", "--out", str(out)]
    args += ["--set", "data.loader=torchvision", "--set", "data.num_threads=2", "--steps", "400"]
    args += ["--set", "schedule.epochs=200", "--set", "schedule.stages=[{until_epoch=200,global_batch=16}]"]
    p = subprocess.Popen(
        [*torchrun(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.time() + 120
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 3):
            assert time.time() < deadline and p.poll() is None, "the run did not start training"
            time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        stdout, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    logs = "".join(path.read_text() for path in (out / "logs").glob("rank*.log"))
    assert "DataLoader worker" not in logs, logs[-2000:]
    assert "stopped by SIGTERM; checkpoint at step " in stdout, stdout[-2000:] + stderr[-2000:]
    assert list((out / "checkpoints").glob("step-*.pt"))
