"""Checkpoints: atomic save with a manifest as commit point; corrupt or partial ones are never loaded."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch

from torus_train.errors import RunFailed
from torus_train.train.checkpoint import (
    find_latest,
    list_checkpoints,
    load_checkpoint,
    prune,
    read_verified,
    ref_from_verdict,
    same_choice,
    save_checkpoint,
    verdict,
)


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


def test_steps_past_eight_digits_are_listed_found_and_pruned(tmp_path):
    """schedule.steps allows 2^31 - 1: a 9- and 10-digit step is named, listed, found and pruned like any other,
    and sorts by its number, not its name; an orphan of such a step goes too."""
    steps = (99_999_999, 100_000_000, 2_147_483_647)
    for step in steps:
        save_checkpoint(tmp_path, step, state(step), {}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2_147_483_647, 100_000_000]
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["step-100000000.pt", "step-2147483647.pt"]
    ref = find_latest(tmp_path)
    assert ref.step == 2_147_483_647 and ref.path.name == "step-2147483647.pt"
    assert torch.equal(load_checkpoint(ref)["model"]["w"], state(2_147_483_647)["model"]["w"])
    orphan = tmp_path / "step-300000000.pt"  # a save killed between the data and the manifest
    orphan.write_bytes(b"partial")
    # names no save writes (too short, an extra leading zero, too long for a step) are not checkpoints
    for odd in ("step-0120.json", "step-000000120.json", "step-" + "9" * 30 + ".json"):
        (tmp_path / odd).write_text("{}")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2_147_483_647, 100_000_000]
    assert orphan in prune(tmp_path, 2) and not orphan.exists()


def test_uncommitted_checkpoint_is_ignored(tmp_path):
    """A kill during save leaves a .pt (or a temporary file) without manifest: never chosen."""
    save_checkpoint(tmp_path, 5, state(5), {}, keep=3)
    torch.save(state(9), tmp_path / "step-00000009.pt")  # data written, manifest never renamed
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
        pt.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
    else:
        pt.unlink()
    warnings = []
    ref = find_latest(tmp_path, warn=warnings.append)
    assert ref.step == 5
    assert len(warnings) == 1 and "step-00000006.pt" in warnings[0]
    with pytest.raises(RunFailed, match=re.escape("step-00000006.pt")):
        read_verified(tmp_path / "step-00000006.json")


def test_all_corrupt_is_an_error_not_a_fresh_start(tmp_path):
    save_checkpoint(tmp_path, 7, state(7), {}, keep=3)
    (tmp_path / "step-00000007.pt").write_bytes(b"garbage")
    with pytest.raises(RunFailed, match=r"no checkpoint in .* is intact"):
        find_latest(tmp_path, warn=lambda m: None)
    assert find_latest(tmp_path / "empty") is None


def test_manifest_records_size_and_hash(tmp_path):
    save_checkpoint(tmp_path, 3, state(3), {"grid": "2x2"}, keep=1)
    m = json.loads((tmp_path / "step-00000003.json").read_text())
    assert m["bytes"] == (tmp_path / "step-00000003.pt").stat().st_size
    assert len(m["sha256"]) == 64 and m["grid"] == "2x2"


def test_verdict_names_the_choice_and_loads_without_hashing(tmp_path, monkeypatch):
    assert verdict(tmp_path / "none") == {"step": None} and ref_from_verdict(tmp_path, {"step": None}) is None
    for step in (5, 7):
        save_checkpoint(tmp_path, step, state(step), {"epoch": 1}, keep=5)
    v = verdict(tmp_path)
    assert v["step"] == 7 and v["file"] == "step-00000007.pt" and v["manifest"]["epoch"] == 1
    assert len(json.dumps(v)) < 400  # small enough for one broadcast
    import torus_train.train.checkpoint as ckpt

    monkeypatch.setattr(ckpt, "read_verified", lambda path: pytest.fail("a rank that loads a verdict must not read"))
    ref = ref_from_verdict(tmp_path, v)
    assert ref.path == tmp_path / "step-00000007.pt"
    assert torch.equal(load_checkpoint(ref)["model"]["w"], state(7)["model"]["w"])


def test_verdict_refusal_and_comparison(tmp_path):
    save_checkpoint(tmp_path, 3, state(3), {}, keep=5)
    (tmp_path / "step-00000003.pt").write_bytes(b"garbage")
    v = verdict(tmp_path, warn=lambda m: None)
    assert "no checkpoint in" in v["error"] and "is intact" in v["error"]
    with pytest.raises(RunFailed, match="is intact"):
        ref_from_verdict(tmp_path, v)
    a = {"step": 7, "file": "f", "manifest": {"sha256": "ab"}}
    assert same_choice(a, dict(a)) and same_choice({"step": None}, {"step": None})
    assert not same_choice(a, {**a, "manifest": {"sha256": "cd"}}) and not same_choice(a, {"step": None})
    assert not same_choice({"step": None}, v)


def test_the_sha256_is_taken_while_writing_and_one_read_verifies(tmp_path):
    from torus_train.train import checkpoint as ckpt

    before = ckpt.BYTES_READ[0]
    pt = save_checkpoint(tmp_path, 7, state(7), {}, keep=2)
    assert ckpt.BYTES_READ[0] == before  # nothing read back to hash it
    manifest = json.loads(pt.with_suffix(".json").read_text())
    assert manifest["bytes"] == pt.stat().st_size and manifest["sha256"] == hashlib.sha256(pt.read_bytes()).hexdigest()
    ref = find_latest(tmp_path)
    assert ckpt.BYTES_READ[0] == before + pt.stat().st_size and ref.data == pt.read_bytes()
    assert torch.equal(load_checkpoint(ref)["model"]["w"], state(7)["model"]["w"])
    assert ckpt.BYTES_READ[0] == before + pt.stat().st_size  # loaded from the bytes held, not the file
