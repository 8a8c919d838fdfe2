"""scripts/gpu_check.sh on a machine without a GPU: argument handling, the JSON skeleton, and the embedded
programs (they compile; their time limits add up to under 8 minutes). The checks themselves need a CUDA GPU."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
CHECKS = {"run_path", "input", "resnet50", "hook_cuda_gloo"}


def run(*args: str, env: dict | None = None):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})})


def test_help_and_usage_errors():
    r = run("--help")
    assert r.returncode == 0 and "gpu_check.sh [--out DIR] [--json FILE]" in r.stdout
    for bad in (["--bogus"], ["--out"], ["--json"]):
        r = run(*bad)
        assert r.returncode == 2 and r.stderr.startswith("gpu_check: ") and r.stdout == "", bad


def test_without_a_gpu_it_says_so_and_prints_the_skeleton(tmp_path):
    r = run("--out", str(tmp_path / "out"), "--json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    assert "no CUDA GPU" in r.stderr
    doc = json.loads(r.stdout)
    assert doc == json.loads((tmp_path / "s.json").read_text())
    assert (doc["status"], doc["gpu"], doc["gpu_check"]) == ("no-gpu", None, 1)
    assert set(doc["checks"]) == CHECKS
    assert all(c["ok"] is None and "seconds" in c for c in doc["checks"].values())
    ref = doc["checks"]["resnet50"]["reference_img_s"]
    assert sorted(ref.values()) == [2470, 8000]


def test_embedded_programs_compile_and_fit_in_eight_minutes():
    text = SCRIPT.read_text()
    parts = re.findall(r"^part (\w+) (\d+) <<'EOF'\n(.*?)^EOF$", text, flags=re.S | re.M)
    assert {name for name, _, _ in parts} == CHECKS
    for name, _, body in parts:
        compile(body, f"gpu_check:{name}", "exec")
    assert sum(int(limit) for _, limit, _ in parts) < 8 * 60
