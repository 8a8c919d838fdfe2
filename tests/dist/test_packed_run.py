"""`torus-train run --data SHARDS`: 4 CPU ranks on a packed set, twice (the second through data.stage = node):
the same parameters bit for bit; the staged copy is made once and reused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .runhelp import leftover_workers, run_cli, summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for datahelp
from datahelp import make_index_set

pytestmark = pytest.mark.timeout(400)

PACKED_RUN = [
    "--gpus",
    "4",
    "--grid",
    "2x2",
    "--model",
    "resnet18",
    "--image-size",
    "32",
    "--steps",
    "3",
    "--set",
    "model.num_classes=3",
    "--set",
    "job.log_every=3",
    "--set",
    "checkpoint.every_epochs=0",
    "--set",
    "eval.every_epochs=0",
    "--set",
    "schedule.stages=[{until_epoch=1,global_batch=16}]",
    "--set",
    "schedule.base_lr=0.1",
    "--set",
    "schedule.lr_reference_batch=16",
    "--set",
    "schedule.warmup_epochs=0.5",
    "--set",
    "data.loader=dali",
]


def test_packed_runs_agree_and_staging_is_reused(tmp_path):
    from torus_train.data.packer import pack

    shards = pack(make_index_set(tmp_path / "d", n_train=48, n_val=6, size=24), tmp_path / "shards", shard_mb=0.02)
    a, b = tmp_path / "a", tmp_path / "b"
    r = run_cli(*PACKED_RUN, "--data", str(shards), "--out", str(a))
    assert r.returncode == 0, r.stdout + r.stderr
    local = tmp_path / "node-local"
    r = run_cli(
        *PACKED_RUN,
        "--data",
        str(shards),
        "--out",
        str(b),
        "--set",
        "data.stage=node",
        "--set",
        f"data.stage_dir={local}",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    sa, sb = summary(a), summary(b)
    assert sa["steps"] == sb["steps"] == 3 and sa["param_digests_agree"] and sb["param_digests_agree"]
    assert sa["param_digest"] == sb["param_digest"]
    staged = list((local / "torus-train-stage").iterdir())
    assert len(staged) == 1 and (staged[0] / "packed.json").is_file()
    assert not leftover_workers(a) and not leftover_workers(b)
