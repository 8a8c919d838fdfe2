"""Checkpoints: atomic save with a manifest as commit point; corrupt or partial ones are never loaded."""
from __future__ import annotations

import json

import pytest
import torch

from torus_train.train.checkpoint import find_latest, list_checkpoints, load_checkpoint, prune, save_checkpoint, verify
from torus_train.errors import RunFailed


def state(step):
    torch.manual_seed(step)
    return {"model": {"w": torch.randn(64, 64)}, "position": {"global_step": step}}


def test_save_then_latest_round_trips(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, state(step), {"epoch": 0}, keep=5)
    ref = find_latest(tmp_path)
    assert ref.step == 30 and ref.manifest["epoch"] == 0
    loaded = load_checkpoint(ref)
    assert torch.equal(loaded["model"]["w"], state(30)["model"]["w"])
    assert not list(tmp_path.glob("*.tmp*"))  # nothing half-written left behind


def test_keep_prunes_oldest(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, state(step), {}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 3]
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["step-00000003.pt", "step-00000004.pt"]
    prune(tmp_path, 0)  # never deletes the newest one
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4]


def test_uncommitted_checkpoint_is_ignored(tmp_path):
    """A kill during save leaves a .pt (or a temporary file) without manifest: never chosen."""
    save_checkpoint(tmp_path, 5, state(5), {}, keep=3)
    torch.save(state(9), tmp_path / "step-00000009.pt")          # data written, manifest never renamed
    (tmp_path / "step-00000010.pt.tmp123").write_bytes(b"partial")
    assert find_latest(tmp_path).step == 5


@pytest.mark.parametrize("damage", ["truncate", "flip", "missing"])
def test_corrupt_newest_falls_back_with_a_warning(tmp_path, damage):
    save_checkpoint(tmp_path, 5, state(5), {}, keep=3)
    save_checkpoint(tmp_path, 6, state(6), {}, keep=3)
    pt = tmp_path / "step-00000006.pt"
    data = pt.read_bytes()
    if damage == "truncate":
        pt.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        i = len(data) // 2
        pt.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    else:
        pt.unlink()
    warnings = []
    ref = find_latest(tmp_path, warn=warnings.append)
    assert ref.step == 5
    assert len(warnings) == 1 and "step-00000006.pt" in warnings[0]
    with pytest.raises(RunFailed, match="step-00000006.pt"):
        verify(tmp_path / "step-00000006.json")


def test_all_corrupt_is_an_error_not_a_fresh_start(tmp_path):
    save_checkpoint(tmp_path, 7, state(7), {}, keep=3)
    (tmp_path / "step-00000007.pt").write_bytes(b"garbage")
    with pytest.raises(RunFailed, match="no checkpoint in .* is intact"):
        find_latest(tmp_path, warn=lambda m: None)
    assert find_latest(tmp_path / "empty") is None


def test_manifest_records_size_and_hash(tmp_path):
    save_checkpoint(tmp_path, 3, state(3), {"grid": "2x2"}, keep=1)
    m = json.loads((tmp_path / "step-00000003.json").read_text())
    assert m["bytes"] == (tmp_path / "step-00000003.pt").stat().st_size
    assert len(m["sha256"]) == 64 and m["grid"] == "2x2"
