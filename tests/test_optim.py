"""Optimizers: parameter groups, LARS's trust ratio against a hand computation, and a model that learns."""

from __future__ import annotations

import pytest
import torch

from torus_train.errors import UserError
from torus_train.train.optim import LARS, build_optimizer, param_groups


def small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, bias=False),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )


def test_bn_and_bias_have_no_weight_decay():
    net = small_net()
    groups = param_groups(net, 1e-4)
    decayed = {id(p) for p in groups[0]["params"]}
    assert decayed == {id(net[0].weight), id(net[5].weight)}
    assert {id(p) for p in groups[1]["params"]} == {id(net[1].weight), id(net[1].bias), id(net[5].bias)}
    assert groups[1]["weight_decay"] == 0.0 and groups[1]["lars"] is False
    opt = build_optimizer(net, "sgd", lr=0.1, momentum=0.9, weight_decay=1e-4)
    assert isinstance(opt, torch.optim.SGD)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]


def test_lars_step_matches_formula():
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))  # ||w|| = 5
    b = torch.nn.Parameter(torch.tensor([1.0]))
    opt = LARS(
        [{"params": [w], "weight_decay": 0.1, "lars": True}, {"params": [b], "weight_decay": 0.0, "lars": False}],
        lr=0.5,
        momentum=0.9,
        trust_coefficient=0.01,
    )
    w.grad = torch.tensor([0.0, 2.0])  # ||g|| = 2
    b.grad = torch.tensor([0.2])
    opt.step()
    trust = 0.01 * 5 / (2 + 0.1 * 5)
    step = 0.5 * trust * (torch.tensor([0.0, 2.0]) + 0.1 * torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(w.detach(), torch.tensor([3.0, 4.0]) - step)
    torch.testing.assert_close(b.detach(), torch.tensor([1.0 - 0.5 * 0.2]))  # plain step, no trust ratio
    # second step uses momentum
    w.grad = torch.tensor([0.0, 2.0])
    before = w.detach().clone()
    opt.step()
    wn, gn = before.norm(), 2.0
    trust2 = 0.01 * wn / (gn + 0.1 * wn)
    step2 = 0.9 * step + 0.5 * trust2 * (torch.tensor([0.0, 2.0]) + 0.1 * before)
    torch.testing.assert_close(w.detach(), before - step2)


def test_lars_zero_weight_falls_back_to_trust_one():
    w = torch.nn.Parameter(torch.zeros(3))
    opt = LARS([{"params": [w], "weight_decay": 0.0, "lars": True}], lr=0.1, momentum=0.0)
    w.grad = torch.ones(3)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full((3,), -0.1))


@pytest.mark.parametrize("name", ["sgd", "lars"])
def test_optimizer_reduces_loss(name):
    net = small_net()
    torch.manual_seed(1)
    x = torch.randn(64, 3, 8, 8)
    y = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1].mean((1, 2)) > 0).long()
    lr = 0.1 if name == "sgd" else 2.0
    opt = build_optimizer(net, name, lr=lr, momentum=0.9, weight_decay=1e-4, trust_coefficient=0.02)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(name="adam"), r"optimizer\.name: 'adam'"),
        (dict(momentum=1.5), r"optimizer\.momentum: 1\.5"),
        (dict(momentum=0.0, nesterov=True), r"optimizer\.nesterov"),
        (dict(trust_coefficient=0.0), r"optimizer\.trust_coefficient"),
    ],
)
def test_bad_settings(kw, match):
    args = dict(name="sgd", lr=0.1, momentum=0.9, weight_decay=1e-4)
    args.update(kw)
    with pytest.raises(UserError, match=match):
        build_optimizer(small_net(), **args)


def reference_lars_step(params_groups, state):
    """LARS as a per-tensor loop, written out as in the class docstring: the multi-tensor step must equal it."""
    for group in params_groups:
        lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
        for p in group["params"]:
            g = p.grad
            if group["lars"]:
                w_norm, g_norm = p.norm(), g.norm()
                trust = (
                    group["trust_coefficient"] * w_norm / (g_norm + wd * w_norm)
                    if w_norm > 0 and g_norm > 0
                    else torch.tensor(1.0)
                )
                scaled = (g + wd * p) * (trust * lr)
            else:
                scaled = g * lr
            buf = state.get(p)
            state[p] = buf = scaled.clone() if buf is None else buf.mul(mom).add(scaled)
            p.sub_(buf.mul(mom).add(scaled) if group["nesterov"] else buf)


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_multi_tensor_step_equals_the_per_tensor_loop(nesterov):
    torch.manual_seed(0)
    a, b = small_net(), small_net()
    b.load_state_dict(a.state_dict())
    opt = build_optimizer(a, "lars", lr=0.5, momentum=0.9, weight_decay=1e-4, nesterov=nesterov, trust_coefficient=0.02)
    ref_groups = [
        dict(
            g,
            params=[dict(b.named_parameters())[n] for n, q in a.named_parameters() if any(q is x for x in g["params"])],
        )
        for g in opt.param_groups
    ]
    state = {}
    x = torch.randn(16, 3, 8, 8)
    for _ in range(5):
        for net in (a, b):
            net.zero_grad()
            net(x).square().mean().backward()
        opt.step()
        with torch.no_grad():
            reference_lars_step(ref_groups, state)
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", ["sgd", "lars"])
@pytest.mark.parametrize("nesterov", [False, True])
def test_a_step_flagged_non_finite_changes_nothing_and_the_scale_is_taken_off(name, nesterov):
    """found_inf / grad_scale as GradScaler (or train/step.py) hands them: decided on the device, from step 1."""
    from torus_train.train.step import step_unless

    nets = [small_net(), small_net()]
    opts = [build_optimizer(n, name, lr=0.5, momentum=0.9, weight_decay=1e-4, nesterov=nesterov) for n in nets]
    assert all(o._step_supports_amp_scaling for o in opts)
    x = torch.randn(4, 3, 8, 8)
    for _step in range(3):
        before = [p.detach().clone() for p in nets[0].parameters()]
        moms = [s.get("momentum_buffer") for s in (opts[0].state[p] for p in nets[0].parameters())]
        moms = [m.clone() if m is not None else None for m in moms]
        for net in nets:
            net.zero_grad()
            net(x).sum().backward()
        next(nets[0].parameters()).grad.view(-1)[0] = float("nan")
        step_unless(opts[0], torch.ones(()))  # skipped: parameters and momentum as they were
        assert all(torch.equal(a, b) for a, b in zip(before, nets[0].parameters(), strict=True))
        after = [opts[0].state[p].get("momentum_buffer") for p in nets[0].parameters()]
        assert all(a is None or b is None or torch.equal(a, b) for a, b in zip(moms, after, strict=True))
        opts[1].step()  # the reference takes every step: both agree again after the next unskipped one
        with torch.no_grad():
            for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
                a.copy_(b)
        for o_a, o_b, p_a, p_b in (
            (opts[0], opts[1], a, b) for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True)
        ):
            if "momentum_buffer" in o_b.state[p_b]:
                o_a.state[p_a]["momentum_buffer"] = o_b.state[p_b]["momentum_buffer"].clone()
    # a scaled step (grad x 1024, grad_scale 1024) equals the plain one
    for net in nets:
        net.zero_grad()
        net(x).sum().backward()
    for p in nets[0].parameters():
        p.grad.mul_(1024)
    opts[0].found_inf, opts[0].grad_scale = torch.zeros(()), torch.tensor(1024.0)
    opts[0].step()
    opts[1].step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        torch.testing.assert_close(a, b)
