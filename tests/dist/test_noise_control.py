"""schedule.control = "noise" on real ranks: a grid stage that the measured noise scale starts earlier than its
latest epoch moves the job to the next grid there, and a run resumed from a mid-epoch checkpoint starts each
stage at the same epoch, from the same B_simple bits, as the straight run. Real ranks, hard time guards."""

from __future__ import annotations

import pytest

from .runhelp import leftover_workers, metrics, run_cli, summary

pytestmark = pytest.mark.timeout(400)

# resnet18_w32 on 256 synthetic images per epoch (a batch per rank made once and repeated: the loss falls fast)
BASE = [
    "--data",
    "synthetic",
    "--model",
    "resnet18_w32",
    "--image-size",
    "32",
    "--set",
    "model.num_classes=10",
    "--set",
    "eval.every_epochs=0",
    "--set",
    "schedule.lr_reference_batch=64",
    "--set",
    "schedule.control=noise",
]


def decisions(out) -> list[tuple]:
    return [
        (m["epoch"], m["stage"], m["noise_scale"], m["threshold"], m["why"])
        for m in metrics(out)
        if m.get("event") == "stage_decision"
    ]


def test_the_rule_ends_a_grid_early_and_the_launcher_moves_the_job_there(tmp_path):
    out = tmp_path / "run"
    stages = (
        'schedule.stages=[{until_epoch=2,global_batch=32,grid="2x1"},'
        '{until_epoch=3,global_batch=64,grid="2x2",latest_epoch=2}]'
    )
    r = run_cli(
        *BASE,
        "--epochs",
        "3",
        "--set",
        "data.synthetic_samples=64",
        "--set",
        "job.log_every=1",
        "--set",
        "checkpoint.every_epochs=0",
        "--set",
        stages,
        "--out",
        str(out),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # planned at the latest: the first grid until epoch 2
    assert "grid stages: epochs 0-2 on grid 2x1, then epochs 2-3 on grid 2x2" in r.stdout
    [(epoch, stage, b, threshold, why)] = decisions(out)
    assert (epoch, stage, threshold, why) == (1, 1, 64.0, "noise scale") and b >= 64
    assert f"stage 1 starts at epoch 1: B_simple {b:,.0f} >= 64 (noise scale)" in r.stdout
    # the first grid stopped at epoch 1 with a checkpoint and the next grid started there
    assert "grid stage: epochs 1-3 on 4 ranks, grid 2x2, from the checkpoint at step 2" in r.stdout
    steps = [(m["epoch"], m["global_batch"], m["per_rank_batch"]) for m in metrics(out) if "loss" in m]
    assert steps == [(0, 32, 16), (0, 32, 16), (1, 64, 16), (2, 64, 16)]
    s = summary(out)
    assert (s["world_size"], s["grid"], s["epochs_done"], s["param_digests_agree"]) == (4, "2x2", 3, True)
    assert leftover_workers(out) == []


@pytest.mark.slow
def test_a_resume_from_a_mid_epoch_checkpoint_starts_each_stage_where_the_straight_run_did(tmp_path):
    stages = (
        "schedule.stages=[{until_epoch=2,per_rank_batch=16},{until_epoch=4,per_rank_batch=32},"
        "{until_epoch=6,per_rank_batch=64}]"
    )
    args = [
        *BASE,
        "--epochs",
        "5",
        "--set",
        "data.synthetic_samples=256",
        "--set",
        "job.log_every=2",
        "--set",
        "checkpoint.every_epochs=1",
        "--set",
        stages,
        "--set",
        "schedule.noise_multiple=4",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r = run_cli(*args, "--out", str(straight), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # the same job stopped after 5 of epoch 0's 8 steps (a checkpoint mid-epoch), then resumed to the end
    first = run_cli(*args, "--steps", "5", "--out", str(resumed), timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert decisions(resumed) == []  # nothing decided before the stop
    second = run_cli(*args, "--resume", "--out", str(resumed), timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed at epoch 0, step 5" in second.stdout
    want = decisions(straight)
    assert len(want) == 2 and want[0][4] == "noise scale", want  # at least one start decided by the measure
    assert decisions(resumed) == want  # the same epochs, from the same B_simple bits
    a, b = summary(straight), summary(resumed)
    assert a["param_digest"] == b["param_digest"] and a["steps"] == b["steps"]
