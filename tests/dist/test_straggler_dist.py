"""Two rows of the fault matrix on real 2-rank local runs (`torus-train run --launcher local`): a straggler
injected with TORUS_TRAIN_FAULT=slow:1:SECONDS is named by rank and host in summary.json and in the summary
text; a corrupt JPEG in the data folder is skipped (green, counted) or fails the run naming the file, as
data.on_corrupt says. Each run under a hard wall-clock guard; the seconds are printed for docs/faults.md."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest

from .runhelp import leftover_workers, run_cli

sys.path.insert(0, str(Path(__file__).parent.parent))
from datahelp import make_index_set, wreck_jpeg

pytestmark = pytest.mark.timeout(120)

COMMON = [
    "--launcher",
    "local",
    "--gpus",
    "2",
    "--grid",
    "2x1",
    "--model",
    "resnet18",
    "--set",
    "job.log_every=2",
    "--set",
    "checkpoint.every_epochs=0",
    "--set",
    "data.num_threads=1",
]


def timed(*args: str, env: dict | None = None):
    t = time.time()
    r = run_cli(*COMMON, *args, timeout=90, env=env)
    return r, time.time() - t


def test_straggler_named_by_rank_and_host(tmp_path):
    out = tmp_path / "run"
    r, seconds = timed(
        "--data",
        "synthetic",
        "--image-size",
        "32",
        "--steps",
        "6",
        "--out",
        str(out),
        "--set",
        "checkpoint.at_end=false",
        "--set",
        "eval.every_epochs=0",
        "--set",
        "schedule.stages=[{until_epoch=1,global_batch=16}]",
        "--set",
        "data.synthetic_samples=256",
        env={"TORUS_TRAIN_FAULT": "slow:1:0.6"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    st, ranks = s["stragglers"], s["ranks"]
    slowest = st["slowest"][0]
    assert slowest["rank"] == 1 and slowest["host"] == socket.gethostname()
    assert [row["rank"] for row in ranks] == [0, 1] and all(row["steps"] == 6 for row in ranks)
    # rank 1 slept 0.6 s per step before backward; rank 0's own work excludes its wait for rank 1
    assert ranks[1]["compute_p50"] - ranks[0]["compute_p50"] >= 0.5
    assert ranks[0]["compute_p50"] < 0.6 <= ranks[1]["compute_p50"] <= ranks[1]["compute_max"]
    assert slowest["vs_median"] >= 1.3 and st["median_work_p50"] == ranks[0]["work_p50"]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("straggler:"))
    assert line.startswith(f"straggler: rank 1 on {socket.gethostname()}, own work p50 ")
    print(
        f"\nstraggler: {seconds:.1f} s, rank 1 compute p50 {ranks[1]['compute_p50']:.3f} s against "
        f"{ranks[0]['compute_p50']:.3f} s; {line}"
    )


@pytest.fixture(scope="module")
def corrupt_set(tmp_path_factory):
    root = make_index_set(tmp_path_factory.mktemp("corrupt") / "d", n_train=48, n_val=12)
    bad = sorted((root / "train" / "c1").iterdir())[0]
    wreck_jpeg(bad)  # the content check passes: only decoding finds it
    return root, bad


def corrupt_run(root, out, policy: str, loader: str):
    return timed(
        "--data",
        str(root),
        "--image-size",
        "24",
        "--out",
        str(out),
        "--set",
        "model.num_classes=3",
        "--set",
        "eval.every_epochs=1",
        "--set",
        "schedule.epochs=2",
        "--set",
        "schedule.stages=[{until_epoch=2,global_batch=16}]",
        "--set",
        f"data.loader={loader}",
        "--set",
        f"data.on_corrupt={policy}",
    )


@pytest.mark.parametrize("loader", ["dali", "torchvision"])
def test_corrupt_jpeg_skip_is_green_and_counted(loader, corrupt_set, tmp_path):
    root, bad = corrupt_set
    out = tmp_path / "run"
    r, seconds = corrupt_run(root, out, "skip", loader)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 6 and s["param_digests_agree"] is True  # 48 images / 16 per step, 2 epochs
    assert s["corrupt_skipped"]["policy"] == "skip" and s["corrupt_skipped"]["files"] >= 1
    assert "corrupt images skipped: " in r.stdout
    logs = "".join(p.read_text() for p in (out / "logs").glob("rank*.log"))
    warned = [ln for ln in logs.splitlines() if "corrupt image skipped" in ln]
    assert warned and all(str(bad) in ln for ln in warned)
    assert len(warned) == s["corrupt_skipped"]["files"]  # each rank names a file once
    print(f"\ncorrupt skip ({loader}): exit 0 in {seconds:.1f} s, {s['corrupt_skipped']}")


@pytest.mark.parametrize("loader", ["dali", "torchvision"])
def test_corrupt_jpeg_fail_names_the_file(loader, corrupt_set, tmp_path):
    root, bad = corrupt_set
    out = tmp_path / "run"
    r, seconds = corrupt_run(root, out, "fail", loader)
    assert r.returncode == 1
    assert f"rank 0 failed: {bad}: " in r.stderr or f"rank 1 failed: {bad}: " in r.stderr
    assert not (out / "summary.json").exists() and not leftover_workers(out)
    print(f"\ncorrupt fail ({loader}): exit 1 in {seconds:.1f} s: {r.stderr.strip().splitlines()[-1][:200]}")
