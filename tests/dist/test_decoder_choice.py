"""data.decoder = auto's start-up probe in a real run (2 CPU ranks on a JPEG folder): a decoder that returns
other pixels on one rank, or that raises on every rank, sends every rank to the CPU decoder, said in one line
by rank 0, recorded in summary.json's choices, with the parameters of a data.decoder = cpu run bit for bit.
The faults (TORUS_TRAIN_FAULT=wrongimage / decoderaises, train/faults.py) make CPU ranks probe as CUDA ones do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .runhelp import leftover_workers, run_cli, summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for datahelp
from datahelp import make_index_set

pytestmark = pytest.mark.timeout(400)

RUN = [
    "--gpus",
    "2",
    "--grid",
    "2x1",
    "--model",
    "resnet18",
    "--image-size",
    "24",
    "--steps",
    "2",
    "--set",
    "model.num_classes=3",
    "--set",
    "job.log_every=1",
    "--set",
    "checkpoint.every_epochs=0",
    "--set",
    "eval.every_epochs=0",
    "--set",
    "schedule.stages=[{until_epoch=1,global_batch=8}]",
    "--set",
    "schedule.base_lr=0.1",
    "--set",
    "schedule.lr_reference_batch=8",
    "--set",
    "schedule.warmup_epochs=0",
    "--set",
    "data.loader=torchvision",
    "--set",
    "data.num_threads=0",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_index_set(tmp_path_factory.mktemp("jpegs") / "d", n_train=16, n_val=4, size=24)


@pytest.fixture(scope="module")
def cpu_run(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu") / "run"
    r = run_cli(*RUN, "--data", str(folder), "--out", str(out), "--set", "data.decoder=cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "data.decoder:" not in r.stdout + r.stderr  # a forced choice is obeyed without a word
    assert summary(out)["choices"]["decoder"] == {"choice": "cpu", "why": "data.decoder = cpu"}
    return summary(out)


@pytest.mark.parametrize(
    "fault, why",
    [
        ("wrongimage:1", "on 1 of 2 ranks (rank 1: "),  # rank 0, whose probe passed, names rank 1's reason
        ("decoderaises:all", "on 2 of 2 ranks (rank 0: the device decoder raised RuntimeError: injected decoder"),
    ],
)
def test_a_failed_decoder_probe_runs_on_the_cpu_decoder(fault, why, folder, cpu_run, tmp_path):
    out = tmp_path / "run"
    r = run_cli(*RUN, "--data", str(folder), "--out", str(out), env={"TORUS_TRAIN_FAULT": fault})
    assert r.returncode == 0, r.stdout + r.stderr
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if "data.decoder" in ln]
    assert len(said) == 1 and said[0].startswith("data.decoder: the GPU decoder failed its start-up check ")
    assert why in said[0] and said[0].endswith("; decoding on the CPU (data.decoder = cpu)")
    s = summary(out)
    assert s["choices"]["decoder"]["choice"] == "cpu" and why in s["choices"]["decoder"]["why"]
    assert s["decoder"] == "cpu" and s["param_digests_agree"]
    assert s["param_digest"] == cpu_run["param_digest"]  # the same training as a data.decoder = cpu run
    assert not leftover_workers(out)
