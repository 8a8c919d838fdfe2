"""Stages that change the grid: 2 local ranks (grid 2x1) for epoch 0, then 4 (grid 2x2) from its checkpoint,
the schedule continuing where it stopped (epochs, steps, learning rate). Real ranks, a hard time guard."""

from __future__ import annotations

import json
import time

import pytest

from torus_train.job.spec import load_spec

from .runhelp import leftover_workers, metrics, run_cli, summary

pytestmark = pytest.mark.timeout(200)

STAGES = 'schedule.stages=[{until_epoch=1,global_batch=32,grid="2x1"},{until_epoch=3,global_batch=64,grid="2x2"}]'
ARGS = [
    "--data",
    "synthetic",
    "--model",
    "resnet18",
    "--image-size",
    "32",
    "--epochs",
    "3",
    "--set",
    "job.log_every=1",
    "--set",
    "checkpoint.every_epochs=0",
    "--set",
    "eval.every_epochs=0",
    "--set",
    "data.synthetic_samples=64",
    "--set",
    STAGES,
    "--set",
    "schedule.lr_reference_batch=64",
    "--set",
    "schedule.warmup_epochs=0.5",
]


def test_two_ranks_then_four_from_the_checkpoint(tmp_path):
    out = tmp_path / "run"
    t = time.time()
    r = run_cli(*ARGS, "--out", str(out), timeout=180)
    print(f"2x1 then 2x2: {time.time() - t:.1f} s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torus-train run: 2 ranks on grid 2x1" in r.stdout
    assert "grid stages: epochs 0-1 on grid 2x1, then epochs 1-3 on grid 2x2" in r.stdout
    assert "grid stage: epochs 1-3 on 4 ranks, grid 2x2, from the checkpoint at step 2" in r.stdout
    assert "resuming step 2 of grid 2x1 (2 ranks) on grid 2x2 (4 ranks)" in r.stdout
    s = summary(out)
    assert (s["world_size"], s["grid"], s["steps"], s["epochs_done"], s["param_digests_agree"]) == (
        4,
        "2x2",
        4,
        3,
        True,
    )
    # 64 samples: 2 steps of 32 on 2 ranks in epoch 0, then one step of 64 on 4 ranks in each of epochs 1 and 2
    steps = [m for m in metrics(out) if "loss" in m and "step" in m]
    assert [(m["step"], m["epoch"], m["global_batch"], m["per_rank_batch"]) for m in steps] == [
        (1, 0, 32, 16),
        (2, 0, 32, 16),
        (3, 1, 64, 16),
        (4, 2, 64, 16),
    ]
    # the learning rate follows the one schedule of the whole run across the move
    sched = load_spec(
        None,
        [
            ("schedule.epochs", 3),
            (
                "schedule.stages",
                [
                    {"until_epoch": 1, "global_batch": 32, "grid": "2x1"},
                    {"until_epoch": 3, "global_batch": 64, "grid": "2x2"},
                ],
            ),
            ("schedule.lr_reference_batch", 64),
            ("schedule.warmup_epochs", 0.5),
        ],
    ).schedule.at(4)
    want = [sched.lr_at(e) for e in (0.0, 0.5, 1.0, 2.0)]
    assert [m["lr"] for m in steps] == pytest.approx(want, rel=1e-6)
    manifests = {
        json.loads(p.read_text())["step"]: json.loads(p.read_text()) for p in (out / "checkpoints").glob("step-*.json")
    }
    assert (manifests[2]["grid"], manifests[2]["world_size"], manifests[4]["grid"]) == ("2x1", 2, "2x2")
    assert not leftover_workers(out)


@pytest.mark.slow
def test_stop_epoch_then_resume_starts_with_the_next_grid(tmp_path):
    """schedule.stop_epoch=1 ends the job after the 2x1 leg with a checkpoint; --resume without it picks the leg
    of that checkpoint's epoch, the 2x2 one, and finishes the schedule there."""
    out = tmp_path / "run"
    r = run_cli(*ARGS, "--out", str(out), "--set", "schedule.stop_epoch=1", timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "grid stages" not in r.stdout and (summary(out)["grid"], summary(out)["steps"]) == ("2x1", 2)
    r = run_cli(*ARGS, "--out", str(out), "--resume", timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torus-train run: 4 ranks on grid 2x2" in r.stdout and "resumed at epoch 1, step 2" in r.stdout
    s = summary(out)
    assert (s["world_size"], s["grid"], s["steps"], s["epochs_done"], s["param_digests_agree"]) == (
        4,
        "2x2",
        4,
        3,
        True,
    )
    assert not leftover_workers(out)
