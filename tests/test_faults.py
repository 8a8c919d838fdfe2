"""TORUS_TRAIN_FAULT is parsed once into one Fault and wraps only what it acts on; without it nothing is
installed (the step's code holds no fault branch)."""

from __future__ import annotations

import math
import types

import pytest
import torch

from torus_train.errors import UserError
from torus_train.train import faults
from torus_train.train.stop import StopRequest


def run_state(rank: int = 1, step: int = 0):
    model = torch.nn.Linear(2, 1)
    return types.SimpleNamespace(
        boot=types.SimpleNamespace(info=types.SimpleNamespace(rank=rank)),
        pos=types.SimpleNamespace(global_step=step),
        model=model,
        loss_fn=torch.nn.MSELoss(),
        stop=StopRequest(),
    )


def test_no_variable_no_fault():
    assert faults.from_environ({}) is None
    assert faults.from_environ({"TORUS_TRAIN_FAULT": ""}) is None


@pytest.mark.parametrize(
    "value, kind, rank, at",
    [
        ("step:1:3", "step", 1, 3),
        ("nanfrom:all:2", "nanfrom", None, 2),
        ("slow:0:0.25", "slow", 0, 0.25),
        ("start:2", "start", 2, 0.0),
        ("hang:3:5", "hang", 3, 5),
    ],
)
def test_parse(value, kind, rank, at):
    f = faults.from_environ({"TORUS_TRAIN_FAULT": value})
    assert (f.kind.name, f.rank, f.at) == (kind, rank, at)


@pytest.mark.parametrize(
    "value, said",
    [
        ("boom:1:3", "unknown fault kind 'boom'; choose one of step, stop"),
        ("step:1", "should read step:RANK:STEP"),
        ("start:1:2", "should read start:RANK"),
        ("nan:x:3", "the rank 'x' is not a number"),
        ("nan:1:-3", "at least 0"),
    ],
)
def test_bad_values_name_what_is_wrong(value, said):
    with pytest.raises(UserError, match="TORUS_TRAIN_FAULT=") as e:
        faults.parse(value)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_install_leaves_other_ranks_untouched():
    rs = run_state(rank=0)
    loss_fn, on_step = rs.loss_fn, rs.stop.on_step
    faults.install(faults.parse("nan:1:1"), rs)
    assert rs.loss_fn is loss_fn and rs.stop.on_step is on_step


def test_nan_loss_at_its_step_only():
    rs = run_state(rank=1, step=0)
    faults.install(faults.parse("nan:1:2"), rs)
    x, y = torch.ones(1, 2), torch.zeros(1, 1)
    assert math.isfinite(rs.loss_fn(rs.model(x), y).item())  # step 1
    rs.pos.global_step = 1
    assert math.isnan(rs.loss_fn(rs.model(x), y).item())  # step 2
    rs.pos.global_step = 2
    assert math.isfinite(rs.loss_fn(rs.model(x), y).item())


def test_after_step_faults_chain_on_the_heartbeat():
    rs, seen = run_state(rank=1), []
    rs.stop.on_step = seen.append
    faults.install(faults.parse("diverge:all:2"), rs)
    before = next(rs.model.parameters()).detach().clone()
    rs.stop.beat(1)
    assert torch.equal(next(rs.model.parameters()), before)
    rs.stop.beat(2)
    assert seen == [1, 2]  # the heartbeat still records every step
    assert next(rs.model.parameters()).view(-1)[0].item() == pytest.approx(before.view(-1)[0].item() + 1e-3)
