"""Helpers for the `torus-train run` multi-process tests: run the CLI with a hard timeout, read its outputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# 4 CPU ranks on a 2x2 grid, resnet18 at 32x32 on synthetic data: a few seconds per step on 2 cores.
TINY = ["--gpus", "4", "--grid", "2x2", "--data", "synthetic", "--model", "resnet18", "--image-size", "32",
        "--set", "job.log_every=2", "--set", "checkpoint.every_epochs=0", "--set", "eval.every_epochs=0"]


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
        if "torus_train.worker" in cmd and str(out) in cmd:
            found.append(f"{pid}: {cmd}")
    return found
