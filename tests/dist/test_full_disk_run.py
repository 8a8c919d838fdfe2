"""The whole job on a full output file system: OUT on a tmpfs of the test's own, filled to the last byte by
another writer after the checkpoint at step 8. Judged as a user would: the final line names OUT and "no
space", exit 1, no restart although --max-restarts allows one, the checkpoint at step 8 intact, no empty
marker, no rank left running. Real CLI, real rank, real full file system."""

from __future__ import annotations

import threading
import time

import pytest
from fulldisk import fill, small_fs

from torus_train.train.checkpoint import list_checkpoints, read_verified

from .runhelp import leftover_workers, run_cli

pytestmark = pytest.mark.timeout(300)

ONE = ["--data", "synthetic", "--gpus", "1", "--grid", "1x1", "--model", "resnet18", "--image-size", "32"]


def fill_after(manifest, filler, filled: list) -> None:
    deadline = time.time() + 150
    while not manifest.exists() and time.time() < deadline:
        time.sleep(0.02)
    filled.append(fill(filler))


def test_a_full_disk_ends_the_job_with_its_line_and_keeps_the_checkpoint(tmp_path):
    with small_fs(tmp_path / "fs", "300m") as fs:  # a resnet18 checkpoint is ~90 MB
        out = fs / "O"
        filled: list = []
        filler = threading.Thread(
            target=fill_after, args=(out / "checkpoints" / "step-00000008.json", fs / "x", filled)
        )
        filler.start()
        args = ["--steps", "24", "--set", "checkpoint.every_steps=8", "--max-restarts", "1", "--out", str(out)]
        r = run_cli(*ONE, *args, env={"OMP_NUM_THREADS": "1", "TORUS_TRAIN_FAULT": "slow:0:0.3"}, timeout=200)
        filler.join(timeout=60)
        assert filled, "the run ended before its first checkpoint"
        final = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 1, r.stderr
        assert final.startswith("torus-train: error: rank 0 failed: ") and str(out) in final and "no space" in final
        assert "restart 1 of 1" not in r.stderr and "not restarted" in final
        assert "Traceback" not in r.stderr and "Errno" not in r.stderr
        assert [s for s, _ in list_checkpoints(out / "checkpoints")] == [8]
        assert read_verified(out / "checkpoints" / "step-00000008.json").step == 8
        assert all(p.stat().st_size for p in (out / "logs").glob("*.failed")), "an empty marker"
        assert (out / "logs" / "rank00000.failed").exists()
        assert leftover_workers(out) == []
