"""The environment: the Python the code needs (vermin) against pyproject's requires-python, the tomli fallback
of Python 3.10, and the check of a GPU's architecture against the torch build (values injected, no GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torus_train.ranks.bootstrap import gpu_arch_problem

ROOT = Path(__file__).resolve().parents[1]
CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]  # torch 2.14 cu130's list


def requires_python() -> tuple[int, int]:
    from torus_train.job.spec import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert spec.startswith(">="), spec
    major, minor = spec[2:].split(".")[:2]
    return int(major), int(minor)


def test_the_code_runs_on_the_python_pyproject_states():
    """vermin (the test extra) finds no construct newer than requires-python in torus_train/."""
    pytest.importorskip("vermin", reason="pip install -e '.[test]' installs vermin")
    low = "{}.{}".format(*requires_python())
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, vermin; sys.exit(vermin.main())",
            "-q",
            "--no-tips",
            "--violations",
            f"-t={low}-",
            "--eval-annotations",
            str(ROOT / "torus_train"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"needs more than Python {low}:\n{r.stdout}{r.stderr}"


def test_specs_load_without_tomllib_as_on_python_3_10():
    """Python 3.10 has no tomllib: the spec reader falls back to tomli (a dependency there)."""
    pytest.importorskip("tomli")
    code = (
        "import sys; sys.modules['tomllib'] = None\n"
        "from torus_train.job.spec import load_spec, tomllib\n"
        "assert tomllib.__name__ == 'tomli', tomllib\n"
        "print(load_spec(None, [('model.arch', 'resnet18')]).model.arch)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "resnet18", r.stderr


@pytest.mark.parametrize(
    "capability, archs, ok",
    [
        ((9, 0), CU130, True),  # H100/H200
        ((8, 9), CU130, True),  # L40: runs sm_86 cubins
        ((12, 1), CU130, True),  # sm_120 cubin (same major, lower minor)
        ((13, 0), CU130, True),  # a future GPU: compute_120 PTX is JIT-compiled
        ((7, 0), CU130, False),  # V100: CUDA 13 has no Volta
        ((7, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], True),  # a cu126 build
        ((10, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], False),  # B200 on cu126: too new
        ((9, 0), [], False),
    ],
)
def test_the_gpu_architecture_decision(capability, archs, ok):
    problem = gpu_arch_problem(capability, archs, "Tesla X", "2.14.1+cu130", "13.0")
    assert (problem is None) is ok, problem
    if not ok:
        assert "\n" not in problem and f"sm_{capability[0]}{capability[1]}" in problem
        assert "torch 2.14.1+cu130 (CUDA 13.0)" in problem and "install a torch built with" in problem


def test_an_old_gpu_is_told_to_install_a_cuda_12_build():
    problem = gpu_arch_problem((7, 0), CU130, "Tesla V100-SXM2-32GB", "2.14.1+cu130", "13.0")
    assert problem == (
        "GPU Tesla V100-SXM2-32GB has compute capability sm_70, which torch 2.14.1+cu130 (CUDA 13.0) "
        "has no kernels for (it has sm_75, sm_80, sm_86, sm_90, sm_100, sm_120, compute_120); "
        "install a torch built with CUDA 12 (e.g. pip install torch torchvision --index-url "
        "https://download.pytorch.org/whl/cu126), or run in the container of Singularity.def"
    )
