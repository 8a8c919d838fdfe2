"""job.deterministic: the switch (spec field, `run --deterministic`) reaches the rank's torch settings before
the model is built; off, cuDNN autotunes on a GPU."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from torus_train.cli import cli
from torus_train.errors import UserError
from torus_train.job.spec import load_spec, parse_override
from torus_train.train import build, loop
from torus_train.train.build import set_determinism
from torus_train.train.determinism import DETERMINISTIC_ENV


@pytest.fixture
def restore_torch_settings():
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]


def settings():
    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )


@pytest.mark.parametrize("device", ["cpu", "cuda"])  # torch.device("cuda") is only a name here: no GPU touched
def test_set_determinism_on_and_off(device, restore_torch_settings):
    env: dict[str, str] = {}
    set_determinism(True, torch.device(device), env)
    assert settings() == (True, True, False) and env == DETERMINISTIC_ENV == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    set_determinism(False, torch.device(device), env)
    assert settings() == (False, False, device == "cuda")  # autotuning only where there is cuDNN to tune
    user = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}  # also a deterministic setting: the user's value stands
    set_determinism(True, torch.device(device), user)
    assert user == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}


class Built(Exception):
    pass


@pytest.mark.parametrize("flag", [[], ["--deterministic"]])
def test_the_flag_reaches_the_rank_before_the_model_is_built(flag, monkeypatch, restore_torch_settings):
    """`run --deterministic` puts job.deterministic in the spec the ranks get; the rank's start sets torch's
    switches from it before it builds the model."""
    r = CliRunner().invoke(cli, ["run", *flag, "--dry-run"])
    assert r.exit_code == 0, r.output
    on = bool(flag)
    assert f"deterministic = {'true' if on else 'false'}" in r.output
    spec = load_spec(None, [parse_override(f"job.deterministic={'true' if on else 'false'}")])
    seen = {}

    def build_model(spec_, device):
        seen["settings"] = settings()
        raise Built

    monkeypatch.setattr(loop, "build_model", build_model)
    torch.use_deterministic_algorithms(not on)  # the opposite first: the start must set it
    boot = SimpleNamespace(device=torch.device("cpu"), info=SimpleNamespace(rank=0))
    with pytest.raises(Built):
        loop.start(spec, boot, None, None)
    assert seen["settings"] == (on, on, False)


def test_once_cuda_started_without_cublas_workspace_determinism_is_refused_in_one_line(
    monkeypatch, restore_torch_settings
):
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG at the process's first gemm: once CUDA has started (stood in here),
    setting it is too late, and turning determinism on is refused, naming the variable and its value; a value
    already there (the user's) passes, and turning it off needs none."""
    monkeypatch.setattr(build, "cuda_started", lambda: True)
    env: dict[str, str] = {}
    with pytest.raises(UserError) as refused:
        set_determinism(True, torch.device("cuda"), env)
    text = str(refused.value)
    assert "\n" not in text and "CUDA started in this process without CUBLAS_WORKSPACE_CONFIG" in text
    assert "set CUBLAS_WORKSPACE_CONFIG=:4096:8 before the process starts" in text and env == {}
    assert not torch.are_deterministic_algorithms_enabled()  # nothing switched on the way to the refusal
    user = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    set_determinism(True, torch.device("cuda"), user)
    assert settings() == (True, True, False) and user == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    set_determinism(False, torch.device("cuda"), {})
    assert settings() == (False, False, True)


def test_check_sets_cublas_workspace_before_its_parts_run(monkeypatch, restore_torch_settings):
    """`torus-train check` runs the graphs part's gemms before the deterministic part: the check's process sets
    the variable before any part, so the deterministic part passes where CUDA has started (stood in) and the
    parent's environment lacked it."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "unset by the test")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    monkeypatch.setattr(build, "cuda_started", lambda: True)
    from torus_train.check.parts import run_parts

    found = run_parts(["environment", "deterministic"], lambda text: None, quick=True)
    verdict, _ = found["deterministic"]
    assert verdict.ok is True, verdict.why
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == DETERMINISTIC_ENV["CUBLAS_WORKSPACE_CONFIG"]
