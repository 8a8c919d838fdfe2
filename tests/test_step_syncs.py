"""No host read in a training step: the counter sees reads, and the real loop makes none outside its intervals
(scripts/dev/check_step_syncs.py, on a smaller model)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from torus_train.train.syncs import PRECISIONS, SyncCounter

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "dev" / "check_step_syncs.py"
SMALL = dict(image_size=32, batch=2, arch="shufflenet_v2_x0_5")  # 0.35M parameters, BatchNorm and biases


def script():
    spec = importlib.util.spec_from_file_location("check_step_syncs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_counter_sees_each_kind_of_host_read():
    t, z = torch.tensor([1.0, 0.0]), torch.tensor(2.0)
    reads = [
        lambda: z.item(),
        lambda: bool(z),
        lambda: t.tolist(),
        lambda: t.numpy(),
        lambda: t.nonzero(),
        lambda: torch.equal(t, t),
        lambda: f"{z:.1f}",
        lambda: t[t > 0],
    ]
    for read in reads:
        with SyncCounter() as c:
            read()
        assert c.count == 1, (read, c.where)
    with SyncCounter() as c:  # device-side work only
        torch.where(z > 1, t, t * 2).sum().add_(1)
        torch.isfinite(t).all().float()
    assert c.count == 0, c.where


@pytest.mark.timeout(240)
def test_no_host_read_in_a_step_of_any_precision(monkeypatch):
    found = script().count_all(7, "lars", **SMALL)
    assert set(found) == set(PRECISIONS)
    for precision, r in found.items():
        assert r["interval_steps"] == [5, 7]  # the logging steps, left out
        assert r["steps"] == 4 and r["syncs"] == 0, (precision, r["where"])


@pytest.mark.timeout(120)
def test_a_read_in_a_step_is_counted_and_placed(monkeypatch):
    from torus_train.train import loop

    # a host read planted in the step's own code: set_lr runs once per step
    monkeypatch.setattr(loop, "set_lr", lambda opt, lr: opt.param_groups[0]["params"][0].sum().item())
    found = script().count_all(7, "sgd", ["fp32"], **SMALL)["fp32"]
    assert found["syncs"] == found["steps"] == 4
    [(where, n)] = found["where"].items()
    assert (
        n == 4
        and where.startswith("aten::_local_scalar_dense at ")
        and "test_step_syncs.py:" in where
        and where.endswith(" <lambda>")
    )


def test_script_writes_the_json_of_the_issue(monkeypatch, tmp_path):
    mod = script()
    counts = {p: {"steps": 5, "syncs": 0, "interval_steps": [5, 7], "where": {}} for p in PRECISIONS}
    monkeypatch.setattr(mod, "count_all", lambda steps, optimizer: counts)
    assert mod.main(["--json", str(tmp_path / "s.json"), "--steps", "7"]) == 0
    assert json.loads((tmp_path / "s.json").read_text()) == {
        "steps": 5,
        "syncs_per_step": {"fp32": 0.0, "bf16": 0.0, "fp16-scaler": 0.0},
    }
    counts["bf16"]["syncs"] = 10
    assert mod.main(["--json", str(tmp_path / "s.json"), "--steps", "7"]) == 1
