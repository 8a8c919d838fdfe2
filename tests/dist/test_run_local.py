"""`torus-train run` with the local launcher: 4 CPU ranks on gloo, outputs, resume, and failing ranks."""

from __future__ import annotations

import time

import pytest
import torch

from .runhelp import TINY, final_params, leftover_workers, metrics, run_cli, summary

pytestmark = pytest.mark.timeout(300)


def test_stages_eval_and_outputs(tmp_path):
    out = tmp_path / "run"
    r = run_cli(
        *TINY,
        "--epochs",
        "2",
        "--out",
        str(out),
        "--set",
        "comm.algo=ddp",
        "--set",
        "eval.every_epochs=1",
        "--set",
        "eval.target_top1=0.01",
        "--set",
        "data.synthetic_samples=128",
        "--set",
        "schedule.stages=[{until_epoch=1,global_batch=32},{until_epoch=2,global_batch=64}]",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    s = summary(out)
    assert (s["world_size"], s["grid"], s["steps"], s["epochs_done"]) == (4, "2x2", 6, 2)  # 4 + 2 steps
    assert s["param_digests_agree"] is True and len(s["param_digest"]) == 64
    assert 0 <= s["val_top1"] <= 1 and s["images_per_second"] > 0 and s["wall_seconds"] > 0
    evals = [m for m in metrics(out) if m.get("event") == "eval"]
    reached = [m for m in evals if m["top1"] >= 0.01]
    assert s["best_top1"] == max(m["top1"] for m in evals)
    if reached:  # time-to-target: the first eval at or above the target, in epochs and seconds
        assert s["time_to_target_epoch"] == reached[0]["epoch"] + 1
        assert s["time_to_target_seconds"] == reached[0]["wall_seconds"]
    else:
        assert s["time_to_target_epoch"] is None
    lines = metrics(out)
    stages = [m for m in lines if m.get("event") == "stage"]
    assert [(m["epoch"], m["global_batch"], m["per_rank_batch"]) for m in stages] == [(0, 32, 8), (1, 64, 16)]
    assert len([m for m in lines if m.get("event") == "eval"]) == 2
    steps = [m for m in lines if "event" not in m]
    for key in ("step", "epoch", "global_batch", "lr", "loss", "images_per_second", "data_time", "step_time"):
        assert all(key in m for m in steps), key
    assert steps[-1]["global_batch"] == 64
    # the noise scale (on by default): on every step line, and in the summary at each stage change and the end
    assert all(isinstance(m["noise_g2"], float) and isinstance(m["noise_trace"], float) for m in steps)
    noise = s["noise_scale"]
    assert [(m["stage"], m["epoch"]) for m in noise["stage_changes"]] == [(0, 0), (1, 1)]
    at4 = next(m for m in steps if m["step"] == 4)  # the last step before stage 1 began
    assert noise["stage_changes"][1]["step"] == 4 and noise["stage_changes"][1]["noise_trace"] == at4["noise_trace"]
    assert noise["end"]["noise_trace"] == steps[-1]["noise_trace"] and noise["end"]["noise_trace"] > 0
    assert all((out / "logs" / f"rank{r:05d}.log").stat().st_size > 0 for r in range(4))
    assert "img/s" in r.stdout and "stage 1 from epoch 1: global batch 64" in r.stdout
    assert not leftover_workers(out)

    # The same folder again: refused (exit 2), results untouched.
    again = run_cli(*TINY, "--steps", "2", "--out", str(out))
    assert again.returncode == 2 and "already holds results" in again.stderr and "--resume" in again.stderr
    assert summary(out)["steps"] == 6


@pytest.mark.slow
def test_resume_continues_like_a_straight_run(tmp_path):
    common = [*TINY, "--set", "comm.algo=ddp", "--set", "checkpoint.every_steps=2"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    r = run_cli(*common, "--steps", "6", "--out", str(straight))
    assert r.returncode == 0, r.stderr
    r = run_cli(*common, "--steps", "3", "--out", str(split))
    assert r.returncode == 0, r.stderr
    other = tmp_path / "other_grid"  # the same checkpoint, resumed below on 2 ranks (grid 2x1)
    (other / "checkpoints").mkdir(parents=True)
    for f in (split / "checkpoints").iterdir():
        (other / "checkpoints" / f.name).write_bytes(f.read_bytes())
    r = run_cli(*common, "--steps", "6", "--out", str(split), "--resume")
    assert r.returncode == 0, r.stderr
    assert "resumed at epoch 0, step 3" in r.stdout
    assert summary(split)["steps"] == 6
    assert summary(split)["param_digest"] == summary(straight)["param_digest"]
    a, b = final_params(straight), final_params(split)
    assert all(torch.equal(a[k], b[k]) for k in a)
    last_loss = lambda out: [m["loss"] for m in metrics(out) if m.get("step") == 6 and "loss" in m]  # noqa: E731
    assert last_loss(split) == last_loss(straight)  # the interval of steps 5-6 is the same in both runs
    # the noise scale's averages went into the checkpoint and on from there: the same bits at the end
    assert summary(split)["noise_scale"]["end"] == summary(straight)["noise_scale"]["end"]

    # Resume by hand on another grid (2 ranks instead of 4): refused, the checkpoint untouched. The launcher's
    # own grid moves resume on purpose (run_training(regrid=True)): tests/dist/test_regrid.py.
    smaller = [a if a not in ("4", "2x2") else {"4": "2", "2x2": "2x1"}[a] for a in common]
    r = run_cli(*smaller, "--steps", "4", "--out", str(other), "--resume")
    assert r.returncode == 1
    assert "step-00000003.pt was written on grid 2x2 (4 ranks), this job runs on grid 2x1 (2 ranks)" in r.stderr
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == [
        "step-00000002.json",
        "step-00000002.pt",
        "step-00000003.json",
        "step-00000003.pt",
    ]


def test_rank_failing_at_start_is_named(tmp_path):
    out = tmp_path / "run"
    t = time.time()
    r = run_cli(*TINY, "--steps", "4", "--out", str(out), env={"TORUS_TRAIN_FAULT": "start:2"}, timeout=120)
    assert r.returncode == 1
    assert "rank 2 exited with code 1" in r.stderr and "injected start-up failure" in r.stderr
    assert time.time() - t < 60
    assert not leftover_workers(out)


@pytest.mark.parametrize(
    "fault, message",
    [
        ("step:2:2", "rank 2 was killed by SIGKILL"),
        ("exit0:2:2", "rank 2 exited with code 0 before finishing"),
    ],
)
def test_rank_ending_mid_run_is_named(tmp_path, fault, message):
    out = tmp_path / "run"
    t = time.time()
    r = run_cli(
        *TINY,
        "--steps",
        "20",
        "--out",
        str(out),
        "--set",
        "comm.algo=ddp",
        env={"TORUS_TRAIN_FAULT": fault},
        timeout=120,
    )
    assert r.returncode == 1
    assert message in r.stderr, r.stderr
    assert time.time() - t < 60
    assert not leftover_workers(out)


def test_hung_rank_is_named_after_the_timeout(tmp_path):
    """Rank 1 frozen with SIGSTOP mid-run, 5 s collective timeout: the others time out, rank 1 is named."""
    out = tmp_path / "run"
    t = time.time()
    r = run_cli(
        *TINY,
        "--steps",
        "30",
        "--out",
        str(out),
        "--set",
        "comm.timeout_s=5",
        env={"TORUS_TRAIN_FAULT": "stop:1:2"},
        timeout=150,
    )
    took = time.time() - t
    assert r.returncode == 1, r.stderr
    assert "rank 1 stopped responding (process stopped)" in r.stderr, r.stderr
    assert took < 90, took  # start-up + 2 steps + 5 s timeout + grace, on a shared 2-core machine
    assert not leftover_workers(out)


def test_sigterm_to_the_launcher_stops_every_rank(tmp_path):
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    argv = [sys.executable, "-m", "torus_train", "run", *TINY, "--steps", "500", "--out", str(out)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
            assert time.time() < deadline and p.poll() is None, "the run did not start training"
            time.sleep(0.5)
        t = time.time()
        p.send_signal(signal.SIGTERM)
        stdout, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0 and "interrupted by SIGTERM" in err, err
    assert time.time() - t < 30
    assert not leftover_workers(out)
    # Forwarded to the ranks, which agreed to stop after the same step and checkpointed it first.
    log2 = (out / "logs" / "rank00002.log").read_text()
    assert "stopped by SIGTERM" in log2 or "a signal on another rank" in log2, log2[-2000:]
    from torus_train.train.checkpoint import find_latest

    ref = find_latest(out / "checkpoints")
    assert ref is not None and ref.step >= 2 and f"checkpoint at step {ref.step}" in stdout


def test_nonfinite_gradient_on_one_rank_is_skipped_by_all(tmp_path):
    out = tmp_path / "run"
    r = run_cli(*TINY, "--steps", "4", "--out", str(out), env={"TORUS_TRAIN_FAULT": "nan:3:2"})
    assert r.returncode == 0, r.stderr
    s = summary(out)
    assert s["skipped_steps"] == 1 and s["steps"] == 4 and s["param_digests_agree"]
    assert all(torch.isfinite(v).all() for v in final_params(out).values() if v.is_floating_point())
    for rank in range(4):
        log = (out / "logs" / f"rank{rank:05d}.log").read_text()
        assert "1 step(s) with non-finite gradients skipped on every rank by step" in log, log[-2000:]
        assert "(the last at step 2)" in log
