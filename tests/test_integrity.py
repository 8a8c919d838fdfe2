"""Issue 15 parts 2-4 in one process: checkpoints load as tensors and plain values only, malformed manifests and
full disks give one line and lose nothing, orphans go, metrics.jsonl is cut back on resume, a checkpoint of
another job or grid is refused, the GradScaler's skipped steps are counted, and the replica check sees one bit."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from torus_train.comm.buckets import BucketedModel
from torus_train.errors import RunFailed
from torus_train.job.spec import JobSpec
from torus_train.train import checkpoint as ckpt
from torus_train.train import faults
from torus_train.train.report import truncate_metrics
from torus_train.train.state import check_identity, job_identity
from torus_train.train.step import bit_digest, check_nonfinite, check_replicas, train_step

pytestmark = pytest.mark.timeout(60)


def real_state(step: int) -> dict:
    """What state.checkpoint_state saves: model, optimizer, position, RNG states, the spec as a dict."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(16, 8)).sum().backward()
    opt.step()
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "cuda": None}
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scaler": None,
        "position": {
            "epoch": 0,
            "step_in_epoch": step,
            "global_step": step,
            "images": 32 * step,
            "seconds": 1.5,
            "target_epoch": None,
            "target_seconds": None,
            "best_top1": None,
        },
        "rng": [rng, rng],
        "grid": "2x1",
        "world_size": 2,
        "spec": JobSpec().to_dict(),
    }


def test_real_state_round_trips_with_weights_only(tmp_path):
    state = real_state(4)
    ckpt.save_checkpoint(tmp_path, 4, state, {"epoch": 0}, keep=2)
    loaded = ckpt.load_checkpoint(ckpt.find_latest(tmp_path))
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
    assert loaded["optimizer"]["state"][0]["momentum_buffer"].equal(state["optimizer"]["state"][0]["momentum_buffer"])
    random.setstate(loaded["rng"][1]["python"])  # a plain tuple still restores Python's generator
    assert loaded["position"] == state["position"] and loaded["spec"] == state["spec"]


class Payload:
    """A pickled object whose loading would run code (create a file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickled_object_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    ckpt.save_checkpoint(tmp_path / "c", 3, {"model": {}, "position": {}, "evil": Payload(marker)}, {}, keep=2)
    assert not marker.exists()
    with pytest.raises(RunFailed, match="holds more than tensors and plain values and is not loaded"):
        ckpt.load_checkpoint(ckpt.find_latest(tmp_path / "c"))
    assert not marker.exists()


@pytest.mark.parametrize(
    "manifest",
    [
        "[1, 2]",
        '"text"',
        "{}",
        '{"step": "7", "file": "step-00000007.pt", "bytes": 1, "sha256": "x"}',
        '{"step": 7, "file": "../../etc/passwd", "bytes": 1, "sha256": "x"}',
        "{not json",
    ],
)
def test_malformed_manifest_is_skipped_with_its_name(tmp_path, manifest):
    ckpt.save_checkpoint(tmp_path, 5, real_state(5), {}, keep=3)
    ckpt.save_checkpoint(tmp_path, 7, real_state(7), {}, keep=3)
    (tmp_path / "step-00000007.json").write_text(manifest)
    warnings: list[str] = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append).step == 5
    assert len(warnings) == 1 and "step-00000007.json" in warnings[0]
    assert "malformed" in warnings[0] or "unreadable" in warnings[0]
    (tmp_path / "step-00000005.json").write_text(manifest)
    v = ckpt.verdict(tmp_path, warn=lambda m: None)  # none intact: a verdict every rank refuses alike
    assert "no checkpoint in" in v["error"]


def test_disk_full_keeps_the_previous_checkpoint_and_no_temporaries(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path, 5, real_state(5), {}, keep=3)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full(obj, f):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RunFailed) as e:
        ckpt.save_checkpoint(tmp_path, 6, real_state(6), {}, keep=3)
    assert str(e.value) == f"checkpoint folder {tmp_path}: no space left; the previous checkpoint at step 5 is kept"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert ckpt.find_latest(tmp_path).step == 5


def test_unwritable_folder_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFailed, match=r"^checkpoint folder .*file/checkpoints: not a directory; no earlier"):
        ckpt.save_checkpoint(tmp_path / "file" / "checkpoints", 1, real_state(1), {}, keep=1)


def test_real_full_tmpfs(tmp_path):
    """A 256 KiB tmpfs: the second checkpoint does not fit; the first stays loadable, nothing else is left."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, timeout=10
        ).returncode
    ):
        pytest.skip("needs root and tmpfs mounts")
    try:
        ckpt.save_checkpoint(mnt, 1, real_state(1), {}, keep=3)
        big = {**real_state(2), "model": {"w": torch.zeros(100_000)}}  # 400 kB
        with pytest.raises(RunFailed, match="no space left; the previous checkpoint at step 1 is kept"):
            ckpt.save_checkpoint(mnt, 2, big, {}, keep=3)
        assert sorted(p.name for p in mnt.iterdir()) == ["step-00000001.json", "step-00000001.pt"]
        assert ckpt.load_checkpoint(ckpt.find_latest(mnt))["position"]["global_step"] == 1
    finally:
        subprocess.run(["umount", str(mnt)], timeout=10, check=True)


def test_orphans_are_pruned(tmp_path):
    ckpt.save_checkpoint(tmp_path, 5, real_state(5), {}, keep=3)
    (tmp_path / "step-00000009.pt").write_bytes(b"data without manifest")
    (tmp_path / "step-00000010.pt.tmp99999").write_bytes(b"partial")
    gone = sorted(p.name for p in ckpt.prune_orphans(tmp_path))
    assert gone == ["step-00000009.pt", "step-00000010.pt.tmp99999"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000005.json", "step-00000005.pt"]


def test_metrics_cut_back_to_the_resumed_step(tmp_path):
    m = tmp_path / "metrics.jsonl"
    rows = [{"event": "stage", "step": 0}, {"step": 2}, {"step": 4}, {"event": "eval", "step": 4}, {"step": 6}]
    m.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8, "lo')  # a torn last line
    assert truncate_metrics(m, 4) == 2
    assert [json.loads(line) for line in m.read_text().splitlines()] == rows[:4]
    assert truncate_metrics(m, 4) == 0 and truncate_metrics(tmp_path / "none.jsonl", 4) == 0


def fake_run(tmp_path, world=2, grid="2x1", **spec):
    s = JobSpec()
    for key, value in spec.items():
        section, field = key.split("__")
        setattr(getattr(s, section), field, value)
    boot = types.SimpleNamespace(info=types.SimpleNamespace(world_size=world, rank=0), grid=grid)
    return types.SimpleNamespace(spec=s, boot=boot, out=tmp_path)


def test_another_job_or_grid_is_refused(tmp_path):
    here = fake_run(tmp_path)
    manifest = {"step": 4, "world_size": 2, "grid": "2x1", "job": job_identity(here.spec)}
    ref = ckpt.CheckpointRef(4, tmp_path / "checkpoints" / "step-00000004.pt", manifest)
    assert check_identity(ref, here, regrid=False) == ""
    assert (here.spec.model.arch, here.spec.model.num_classes) == ("resnet50", 1000)  # JobSpec's defaults
    other = fake_run(tmp_path, model__arch="vgg11", model__num_classes=7)
    with pytest.raises(
        RunFailed,
        match=r"is from another job \(model.arch 'vgg11' here, 'resnet50' in the "
        r"checkpoint; model.num_classes 7 here, 1000 in the checkpoint\)",
    ):
        check_identity(ref, other, regrid=True)
    moved = fake_run(tmp_path, world=4, grid="2x2")
    with pytest.raises(RunFailed, match=r"written on grid 2x1 \(2 ranks\), this job runs on grid 2x2 \(4 ranks\)"):
        check_identity(ref, moved, regrid=False)
    assert check_identity(ref, moved, regrid=True).startswith("resuming step 4 of grid 2x1 (2 ranks) on grid 2x2")
    old = ckpt.CheckpointRef(4, ref.path, {k: v for k, v in manifest.items() if k != "job"})
    assert check_identity(old, here, regrid=False) == ""  # an older manifest: the weights are checked on load
    with pytest.raises(RunFailed, match="malformed"):
        check_identity(ckpt.CheckpointRef(4, ref.path, {**manifest, "job": [1]}), here, regrid=False)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def scaler_run(monkeypatch, k=3):
    model = torch.nn.Linear(4, 2)
    spec = JobSpec()
    spec.job.max_nonfinite_steps = k
    pos = types.SimpleNamespace(global_step=0, epoch=0, step_in_epoch=0, images=0, stage_starts=[])
    rs = types.SimpleNamespace(
        ddp=BucketedModel(model, None, 25),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn=torch.nn.CrossEntropyLoss(),
        amp_dtype=None,
        spec=spec,
        pos=pos,
        scaler=torch.amp.GradScaler("cpu"),
        skip_counts=None,
        skipped_steps=0,
        nonfinite_in_a_row=0,
        boot=types.SimpleNamespace(info=types.SimpleNamespace(rank=0)),
    )
    faults.install(faults.parse("nanfrom:0:3"), rs)  # rank 0's loss is NaN from step 3 on
    return rs


def test_scaler_path_counts_skipped_steps(monkeypatch, one_rank):
    rs = scaler_run(monkeypatch, k=3)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    for step in range(1, 5):  # steps 3 and 4 are non-finite: 2 in a row, under the limit of 3
        train_step(rs, x, y, 1)
        rs.pos.global_step = step
    check_nonfinite(rs)
    assert (rs.skipped_steps, rs.nonfinite_in_a_row) == (2, 2)
    weights = rs.model.weight.detach().clone()
    train_step(rs, x, y, 1)
    rs.pos.global_step = 5
    assert torch.equal(rs.model.weight, weights)  # skipped: the parameters are those of step 2
    with pytest.raises(
        RunFailed, match=r"3 steps in a row had non-finite loss or gradients \(steps 3-5, skipped on every rank"
    ):
        check_replicas(rs, "the check before the checkpoint")


def test_replica_check_sees_non_finite_parameters(monkeypatch, one_rank):
    rs = scaler_run(monkeypatch)
    check_replicas(rs, "the check every 2 steps")
    with torch.no_grad():
        rs.model.bias[1] = float("inf")
    with pytest.raises(RunFailed, match=r"parameters are non-finite at step 0 \(the check every 2 steps\)"):
        check_replicas(rs, "the check every 2 steps")


def test_bit_digest_sees_one_bit_and_ignores_summation_order():
    a = [torch.randn(1000), torch.randn(3, 3).to(torch.bfloat16), torch.tensor(7)]
    b = [t.clone() for t in a]
    assert torch.equal(bit_digest(a), bit_digest(b))
    b[0][500] = torch.nextafter(b[0][500], torch.tensor(float("inf")))
    assert not torch.equal(bit_digest(a), bit_digest(b))
    c = [t.clone() for t in a]
    c[2] += 1  # an integer buffer (num_batches_tracked)
    assert not torch.equal(bit_digest(a), bit_digest(c))


def test_no_checkpoint_inside_a_run_of_non_finite_steps(monkeypatch, one_rank, tmp_path):
    from torus_train.train.state import save

    rs = scaler_run(monkeypatch)
    rs.scaler = None
    rs.nonfinite_in_a_row, rs.pos.global_step = 2, 7
    rs.wall, rs.t0, rs.rank0, rs.progress, rs.out = (lambda: 1.0), 0.0, True, None, tmp_path
    ckpt.save_checkpoint(tmp_path / "checkpoints", 5, real_state(5), {}, keep=2)
    assert save(rs, "every 7 steps") is False  # a stop signal's checkpoint goes the same way
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [5]
    with pytest.raises(
        RunFailed,
        match=r"^the last 2 step\(s\) had non-finite loss or gradients: no checkpoint at "
        r"step 7 \(end of training\); the checkpoint at step 5 is kept$",
    ):
        save(rs, "end of training")
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "checkpoints")] == [5]


def test_buffers_come_from_rank_0_in_one_collective(monkeypatch):
    from torus_train.train.step import sync_buffers

    def net(seed):
        torch.manual_seed(seed)
        n = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.BatchNorm1d(2))
        for _ in range(seed + 1):  # different statistics and counters
            n[1](torch.randn(5, 4, 2, 2)), n[2](torch.randn(3, 2))
        return n

    rank0, mine = net(0), net(1)
    sent = torch.cat([b.reshape(-1).view(torch.uint8) for b in rank0.buffers()])  # what rank 0 sends
    calls = []

    def broadcast(t, src, *a, **k):  # this rank receives rank 0's bytes
        calls.append((t.dtype, t.numel(), src))
        t.copy_(sent)

    monkeypatch.setattr(dist, "broadcast", broadcast)
    sync_buffers(mine)
    assert calls == [(torch.uint8, sent.numel(), 0)]  # 6 buffers (float statistics, int64 counters), one collective
    for (name, a), b in zip(rank0.named_buffers(), mine.buffers(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
