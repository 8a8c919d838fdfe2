"""Helpers for the `torus-train run` multi-process tests: run the CLI with a hard timeout, read its outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# 4 CPU ranks on a 2x2 grid, resnet18 at 32x32 on synthetic data: a few seconds per step on 2 cores.
# The batch schedule is pinned here so that the tests do not follow the tuned recipe of the default spec.
TINY = [
    "--gpus",
    "4",
    "--grid",
    "2x2",
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
    "schedule.stages=[{until_epoch=1,global_batch=64}]",
    "--set",
    "schedule.base_lr=0.1",
    "--set",
    "schedule.lr_reference_batch=64",
    "--set",
    "schedule.warmup_epochs=0.5",
]


def run_cli(*args: str, timeout: float = 180, env: dict | None = None, cmd: list[str] | None = None):
    """`python -m torus_train run ARGS` (or cmd + ARGS); a hang fails the test instead of blocking CI."""
    argv = (cmd or [sys.executable, "-m", "torus_train", "run"]) + list(args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_params(out: Path) -> dict:
    import torch

    pts = sorted((out / "checkpoints").glob("step-*.pt"))
    return torch.load(pts[-1], map_location="cpu", weights_only=False)["model"]


def leftover_workers(out: Path) -> list[str]:
    """Command lines of processes still running a worker of this output folder."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "torus_train.ranks.worker" in cmd and str(out) in cmd:
            found.append(f"{pid}: {cmd}")
    return found


# The reference run shared by the comm and mpirun tests: torus all-reduce, 4 steps at a small LR (so that
# fp32 rounding differences between algorithms stay at rounding size instead of growing chaotically).
REF = [*TINY, "--steps", "4", "--set", "schedule.base_lr=0.01"]


def _local_torus_run(tmp_path_factory):
    import pytest

    out = tmp_path_factory.mktemp("local_torus") / "run"
    r = run_cli(*REF, "--set", "comm.algo=torus", "--out", str(out))
    if r.returncode != 0:
        pytest.fail(f"reference local torus run failed:\n{r.stdout}\n{r.stderr}")
    return out


def local_torus_fixture():
    import pytest

    return pytest.fixture(scope="session", name="local_torus")(_local_torus_run)


def mpi_available() -> bool:
    import shutil

    if not shutil.which("mpirun"):
        return False
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True
