"""job.deterministic: the switch (spec field, `run --deterministic`) reaches the rank's torch settings before
the model is built; off, cuDNN autotunes on a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from torus_train.cli import cli
from torus_train.job.spec import load_spec, parse_override
from torus_train.train import loop
from torus_train.train.build import DETERMINISTIC_ENV, set_determinism


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
