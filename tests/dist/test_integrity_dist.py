"""Issue 15 parts 2 and 4 on 2 real gloo ranks (`torus-train run --launcher local`): a NaN run, a NaN in the
parameters and a diverged replica fail with exit 1 before anything is saved from them; a checkpoint of another
job or grid is refused; a truncated newest checkpoint falls back to the one before, and metrics.jsonl holds no
step twice afterwards. Each run is a few seconds on 2 cores, under a hard subprocess timeout."""

from __future__ import annotations

import pytest

from .runhelp import leftover_workers, metrics, run_cli, summary

pytestmark = pytest.mark.timeout(120)

# 2 CPU ranks (grid 2x1), resnet18 at 32x32, synthetic data, 16 images per rank per step, a checkpoint every 2
# steps; the replica check every 2 steps unless a test says otherwise.
TWO = [
    "--gpus",
    "2",
    "--grid",
    "2x1",
    "--data",
    "synthetic",
    "--model",
    "resnet18",
    "--image-size",
    "32",
    "--set",
    "job.log_every=2",
    "--set",
    "checkpoint.every_epochs=0",
    "--set",
    "eval.every_epochs=0",
    "--set",
    "schedule.stages=[{until_epoch=1,global_batch=32}]",
    "--set",
    "schedule.base_lr=0.1",
    "--set",
    "schedule.lr_reference_batch=32",
    "--set",
    "schedule.warmup_epochs=0.5",
    "--set",
    "checkpoint.every_steps=2",
    "--set",
    "job.check_every_steps=2",
]


def saved_steps(out) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in (out / "checkpoints").glob("step-*.json"))


@pytest.mark.parametrize(
    "fault, check_every, steps, message",
    [
        ("nanfrom:1:3", 2, 12, "5 steps in a row had non-finite loss or gradients (steps 3-7"),
        ("nanparam:all:3", 2, 12, "parameters are non-finite at step 4 (the check every 2 steps) on every rank"),
        (
            "diverge:1:3",
            2,
            12,
            "replicas differ at step 4 (the check every 2 steps): rank(s) 1 disagree with the "
            "other 1 in parameters; nothing was saved",
        ),
        # no periodic check: the last one, before the final checkpoint, still catches it and nothing is written
        (
            "diverge:1:3",
            0,
            4,
            "replicas differ at step 4 (the check before the checkpoint (end of training)): rank(s) 1 disagree",
        ),
    ],
)
def test_a_bad_state_fails_before_it_is_saved(tmp_path, fault, check_every, steps, message):
    out = tmp_path / "run"
    r = run_cli(
        *TWO,
        "--set",
        f"job.check_every_steps={check_every}",
        "--steps",
        str(steps),
        "--out",
        str(out),
        env={"TORUS_TRAIN_FAULT": fault},
        timeout=90,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert message in r.stderr, r.stderr
    assert saved_steps(out) == [2]  # the checkpoint before the fault at step 3, none after it
    assert not (out / "summary.json").exists() and not leftover_workers(out)


def test_resume_refuses_another_job_and_another_grid(tmp_path):
    out = tmp_path / "run"
    r = run_cli(*TWO, "--steps", "2", "--out", str(out), timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    before = summary(out)["param_digest"]

    r = run_cli(*TWO, "--steps", "4", "--out", str(out), "--resume", "--set", "model.num_classes=5", timeout=90)
    assert r.returncode == 1
    assert "step-00000002.pt is from another job (model.num_classes 5 here, 10 in the checkpoint)" in r.stderr

    other = [a if a not in ("2", "2x1") else {"2": "1", "2x1": "1x1"}[a] for a in TWO]
    r = run_cli(*other, "--steps", "4", "--out", str(out), "--resume", timeout=90)
    assert r.returncode == 1
    assert (
        "step-00000002.pt was written on grid 2x1 (2 ranks), this job runs on grid 1x1 (1 ranks); resume it "
        "on its own grid (--grid 2x1)"
    ) in r.stderr
    assert saved_steps(out) == [2] and summary(out)["param_digest"] == before  # nothing was touched


def test_truncated_newest_checkpoint_falls_back_and_metrics_hold_each_step_once(tmp_path):
    out = tmp_path / "run"
    r = run_cli(*TWO, "--steps", "4", "--out", str(out), timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert saved_steps(out) == [2, 4]
    pt = out / "checkpoints" / "step-00000004.pt"
    pt.write_bytes(pt.read_bytes()[:1000])  # truncated
    r = run_cli(*TWO, "--steps", "6", "--out", str(out), "--resume", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed at epoch 0, step 2 (1 metrics lines after it dropped)" in r.stdout
    log = (out / "logs" / "rank00000.log").read_text()
    assert "skipping a bad checkpoint: checkpoint " in log and "step-00000004.pt has 1000 bytes" in log
    rows = [m["step"] for m in metrics(out) if "loss" in m]
    assert rows == [2, 4, 6]  # step 4 of the first run dropped, written again once
    resumes = [m for m in metrics(out) if m.get("event") == "resume"]
    assert resumes == [{"event": "resume", "step": 2, "epoch": 0, "dropped_lines": 1}]
    assert summary(out)["steps"] == 6 and saved_steps(out) == [4, 6]


def test_disk_full_during_a_checkpoint(tmp_path):
    """OUT on a 150 MiB tmpfs: the step-2 checkpoint (about 90 MB: resnet18 and its momentum) fits, the step-4
    one does not. One line naming the folder, exit 1, the step-2 checkpoint intact, no temporaries left."""
    import os
    import subprocess

    from torus_train.train.checkpoint import find_latest, load_checkpoint

    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=150m", "tmpfs", str(mnt)], capture_output=True, timeout=10
        ).returncode
    ):
        pytest.skip("needs root and tmpfs mounts")
    try:
        out = mnt / "run"
        r = run_cli(*TWO, "--steps", "6", "--out", str(out), timeout=90)
        assert r.returncode == 1, r.stdout + r.stderr
        line = f"checkpoint folder {out / 'checkpoints'}: no space left; the previous checkpoint at step 2 is kept"
        assert line in r.stderr, r.stderr
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000002.json", "step-00000002.pt"]
        assert load_checkpoint(find_latest(out / "checkpoints"))["position"]["global_step"] == 2
        assert not (out / "summary.json").exists() and not leftover_workers(out)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], timeout=10, check=True)
