"""A folder holds one run: two `torus-train run` into one --out at once (one refused before launch, the other's
result exactly what it gives alone), and `torchrun --max-restarts` restarts that continue only what their own
first attempt started. Real CLI processes, real torchrun, real ranks; hard time guards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .runhelp import metrics, run_cli, summary

pytestmark = pytest.mark.timeout(300)

ONE = ["--data", "synthetic", "--gpus", "1", "--grid", "1x1", "--model", "resnet18", "--image-size", "32"]
ENV = {"OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--max-restarts", "1"]


def test_a_second_run_into_a_folder_in_use_is_refused_before_launch(tmp_path):
    alone, shared = tmp_path / "alone", tmp_path / "shared"
    first = [*ONE, "--set", "job.seed=1", "--steps", "12", "--set", "checkpoint.every_steps=4"]
    r = run_cli(*first, "--out", str(alone), env=ENV)
    assert r.returncode == 0, r.stderr
    a = subprocess.Popen(
        [sys.executable, "-m", "torus_train", "run", *first, "--out", str(shared)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENV},
    )
    try:
        deadline = time.time() + 60
        while not (shared / "run.lock").exists() or not (shared / "run.lock").read_text():
            assert time.time() < deadline and a.poll() is None, "the first run never claimed its folder"
            time.sleep(0.02)
        b = run_cli(*ONE, "--set", "job.seed=2", "--steps", "16", "--out", str(shared), env=ENV)
        a_out, a_err = a.communicate(timeout=200)
    finally:
        if a.poll() is None:
            a.kill()
    lines = b.stderr.strip().splitlines()
    assert b.returncode == 2 and len(lines) == 1, b.stderr
    assert f"--out {shared}: in use by the run started " in lines[0] and f"(pid {a.pid})" in lines[0]
    assert b.stdout == "", "the refused run started something"
    assert a.returncode == 0, a_err
    assert "done: 12 steps" in a_out
    assert summary(shared)["param_digest"] == summary(alone)["param_digest"]
    steps = [m["step"] for m in metrics(shared) if "loss" in m]
    assert steps == sorted(set(steps)) and steps[-1] == 12, steps
    assert not (shared / "run.lock").exists(), "the claim outlived its run"


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*ONE, *args, cmd=[*TORCHRUN, "-m", "torus_train", "run"], env=ENV, timeout=240)


def test_a_torchrun_restart_refuses_what_its_first_attempt_refused(tmp_path):
    """The first attempt refuses a folder with results (no --resume): the restart refuses it too, instead of
    resuming someone else's run and appending to its metrics."""
    old = tmp_path / "old"
    r = run_cli(*ONE, "--steps", "2", "--out", str(old), env=ENV)
    assert r.returncode == 0, r.stderr
    before = (old / "metrics.jsonl").read_bytes(), json.loads((old / "summary.json").read_text())
    r = torchrun("--steps", "4", "--out", str(old))
    said = r.stdout + r.stderr
    assert r.returncode != 0
    assert said.count(f"{old} already holds results") == 2, said  # attempt 0 and attempt 1, the same line
    assert "resumed at" not in said
    assert (old / "metrics.jsonl").read_bytes() == before[0]
    assert json.loads((old / "summary.json").read_text()) == before[1]


def test_a_torchrun_restart_does_not_turn_resume_of_nothing_into_a_fresh_run(tmp_path):
    empty = tmp_path / "empty"
    r = torchrun("--steps", "4", "--resume", "--out", str(empty))
    said = r.stdout + r.stderr
    assert r.returncode != 0
    assert said.count("--resume: ") == 2 and "nothing to resume" in said, said
    assert not (empty / "summary.json").exists() and not (empty / "metrics.jsonl").exists()
