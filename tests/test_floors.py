"""The floors of the package (docs/extending.md): no import runs upward, pure modules never import torch, and an
import sits inside a function only for a reason (an optional extra, or a pure module reaching torch)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def measure():
    spec = importlib.util.spec_from_file_location(
        "measure_structure", ROOT / "scripts" / "dev" / "measure_structure.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_runs_upward(measure):
    assert measure.measure()["upward_imports"] == []


def test_every_import_inside_a_function_has_its_reason(measure):
    found = measure.measure()["imports_in_functions"]
    assert found["others"] == [] and found["other"] == 0


def test_the_kinds_of_import_are_told_apart(measure):
    assert measure.import_kind("matplotlib.pyplot", "plan.plots") == "optional"
    assert measure.import_kind("torch", "plan.timeline") == "torch"
    assert measure.import_kind("torus_train.train.loop", "ranks.worker") == "torch"
    assert measure.import_kind("torch", "train.build") == "other"  # a torch-side module imports it at the top
    assert measure.import_kind("json", "job.spec") == "other"
    assert measure.import_kind("torus_train.job.spec", "ranks.worker") == "other"


def test_pure_modules_never_import_torch(measure):
    names = sorted(measure.module_name(p) for p in measure.modules())
    pure = [f"torus_train.{n}" if n else "torus_train" for n in names if n not in measure.TORCH_SIDE]
    torch_side = [f"torus_train.{n}" for n in measure.TORCH_SIDE]
    assert set(torch_side) <= {f"torus_train.{n}" for n in names}, "TORCH_SIDE names a module that is gone"
    code = (
        "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
        "    assert 'torch' not in sys.modules, m + ' imports torch'\nprint(len(sys.argv) - 1)"
    )
    out = subprocess.run([sys.executable, "-c", code, *pure], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) == len(pure) > 60
