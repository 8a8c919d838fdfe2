"""The noise-scale estimator (train/noise.py) against brute force: per-example gradients of a small model
(torch.func) give the exact |G|^2 and tr(Sigma); the estimator, over many draws of virtual ranks, is within 4
standard errors of both; what the step's gradient averages over; the averages' per-example decay, the
non-finite hold, the one-rank case and no host read in the step with the estimate on. The real exchange is
tests/dist/test_noise_exchange.py."""

from __future__ import annotations

import math
import types

import pytest
import torch
import torch.nn as nn
from synccount import SyncCounter
from torch.func import functional_call, grad, vmap

from torus_train.comm.buckets import BucketedModel
from torus_train.job.spec import JobSpec, load_spec
from torus_train.train.noise import NoiseScale, build_noise, estimates, no_estimate, sizes
from torus_train.train.optim import build_optimizer
from torus_train.train.step import set_lr, set_step, step_body


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))


def data(n, seed=1):
    """Non-separable: the labels are drawn at random, partly from the inputs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = torch.where(torch.rand(n, generator=g) < 0.5, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long(), 0)
    return x, torch.randint(0, 4, (n,), generator=g).where(torch.rand(n, generator=g) < 0.3, y)


def per_example(m, x, y, smoothing=0.0):
    """Every example's gradient of the (label-smoothed) cross-entropy, as rows of one float64 matrix."""
    params = {k: v.detach() for k, v in m.named_parameters()}
    loss = nn.CrossEntropyLoss(label_smoothing=smoothing)

    def one(p, xi, yi):
        return loss(functional_call(m, p, (xi[None],)), yi[None])

    per = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([per[k].reshape(len(x), -1) for k, _ in m.named_parameters()], dim=1).double()


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_estimates_average_to_the_exact_values(smoothing):
    """With replacement from 200 examples: |G|^2 = |mean g_i|^2, tr(Sigma) = mean |g_i - G|^2 (population).
    4,000 draws of 4 virtual ranks x 5 examples; each estimate's mean within 4 standard errors."""
    x, y = data(200)
    per = per_example(model(), x, y, smoothing)
    exact_g = per.mean(0)
    exact_g2, exact_trace = exact_g.square().sum().item(), (per - exact_g).square().sum(1).mean().item()
    ranks, b, trials = 4, 5, 4000
    pick = torch.randint(0, 200, (trials, ranks, b), generator=torch.Generator().manual_seed(3))
    g_r = per[pick].mean(2)  # (trials, ranks, params): each rank's gradient
    s = g_r.square().sum(2).mean(1)
    q = g_r.mean(1).square().sum(1)
    g2, trace = estimates(s, q, b, b * ranks)
    for est, exact in ((g2, exact_g2), (trace, exact_trace)):
        se = est.std().item() / math.sqrt(trials)
        assert abs(est.mean().item() - exact) < 4 * se, (est.mean().item(), exact, se)
        assert se < 0.2 * abs(exact)  # the bound is tight enough to mean something
    # the ratio of the means estimates B_simple; a single draw's ratio is far off
    assert abs(trace.mean().item() / g2.mean().item() / (exact_trace / exact_g2) - 1) < 0.25


def rank_state(m, accumulation, per_rank_world=1):
    opt = build_optimizer(m, "sgd", 0.1)
    opt.use_device_lr("cpu")
    noise = NoiseScale(torch.device("cpu"), per_rank_world, 1.0)
    noise.set_epoch(1000)
    return types.SimpleNamespace(
        ddp=BucketedModel(m, None, 0.0003, stats=per_rank_world > 1),  # as train/build.py makes it
        optimizer=opt,
        loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1),
        amp_dtype=None,
        scaler=None,
        spec=JobSpec(),
        pos=types.SimpleNamespace(global_step=0),
        skip_counts=None,
        step_now=torch.zeros((), dtype=torch.int64),
        noise=noise,
    )


@pytest.mark.parametrize("accumulation", [1, 2, 4])
def test_the_rank_gradient_is_the_mean_over_its_whole_batch(accumulation):
    """What the estimator's B_small counts: the rank's gradient (and the stats slot's |g|^2) is the mean of the
    per-example gradients of the label-smoothed loss over micro-batch x accumulation examples."""
    x, y = data(8)
    m = model()
    expected = per_example(m, x, y, 0.1).mean(0)
    rs = rank_state(m, accumulation, per_rank_world=2)  # the stats slot holds this rank's |g|^2 (no exchange)
    seen = []
    rs.noise.update = lambda v, found, b, k: seen.append((v.clone(), b))
    step_body(rs, x, y, accumulation)
    flat = torch.cat(rs.ddp.gradient_parts()).double()
    order = [p for b in rs.ddp.buckets for p in b.params]
    by_param = torch.cat([p.grad.reshape(-1) for p in order]).double()
    assert torch.equal(flat, by_param)
    assert torch.allclose(torch.cat([p.grad.reshape(-1) for p in m.parameters()]).double(), expected, rtol=1e-5)
    ((v, b),) = seen
    assert b == 8
    assert v[0].item() == pytest.approx(expected.square().sum().item(), rel=1e-5)  # no exchange: s = q
    assert v[1].item() == pytest.approx(expected.square().sum().item(), rel=1e-5)


def test_the_averages_decay_per_example_and_hold_on_a_skipped_step():
    n = NoiseScale(torch.device("cpu"), 4, 0.5)
    assert n.read() == {} and math.isnan(n.b_simple().item())
    n.set_epoch(2048)  # tau = 1024 examples
    v = torch.tensor([3.0, 1.0])  # s, q
    g2, trace = estimates(3.0, 1.0, 32, 128)
    for _ in range(4):
        n.update(v, torch.zeros(()), 32)  # 4 steps of 128
    by_steps = n.state.clone()
    m = NoiseScale(torch.device("cpu"), 2, 0.5)
    m.set_epoch(2048)
    m.update(v, torch.zeros(()), 128)  # one step of 256 (2 ranks x 128), then two of 128 (2 x 64)
    m.update(v, torch.zeros(()), 64)
    m.update(v, torch.zeros(()), 64)
    assert by_steps[2].item() == pytest.approx(1 - math.exp(-512 / 1024), rel=1e-6)
    assert m.state[2].item() == pytest.approx(by_steps[2].item(), rel=1e-6)  # a stage change keeps the weights
    got = n.read()
    assert got["noise_g2"] == pytest.approx(g2, rel=1e-6) and got["noise_trace"] == pytest.approx(trace, rel=1e-6)
    assert got["noise_scale"] == pytest.approx(trace / g2, rel=1e-6) == n.b_simple().item()
    for bad, found in ((torch.tensor([math.inf, 1.0]), 0.0), (torch.tensor([math.nan, 1.0]), 0.0), (v, 1.0)):
        n.update(bad, torch.tensor(found), 32)
        assert torch.equal(n.state, by_steps)


def test_one_rank_without_accumulation_has_no_estimate_and_the_spec_can_turn_it_off():
    assert sizes(1, 64) is None and sizes(4, 64) == (64, 256) and sizes(1, 64, 2) == (32, 64)
    spec, cpu = load_spec(None), torch.device("cpu")
    assert spec.noise.enabled and build_noise(spec, cpu, 1, [1, 1]) is None
    assert "one rank without accumulation has no small batch" in no_estimate(spec, 1, [1])
    assert no_estimate(spec, 2, [1]) == no_estimate(spec, 1, [1, 2]) == ""
    assert build_noise(spec, cpu, 1, [1, 2]) is not None
    off = load_spec(None, [("noise.enabled", False)])
    assert build_noise(off, cpu, 8, [1]) is None and no_estimate(off, 1, [1]) == ""


@pytest.mark.parametrize("accumulation", [2, 4])
def test_one_rank_with_accumulation_sets_the_micro_batch_against_its_batch(accumulation):
    """s = the mean over micro-batches of |their gradient|^2, q = |the rank's gradient|^2, from brute force."""
    x, y = data(8)
    m = model()
    per = per_example(m, x, y, 0.1)
    rs = rank_state(m, accumulation)
    seen = []
    update = rs.noise.update
    rs.noise.update = lambda v, found, b, k: (seen.append(v.clone()), update(v, found, b, k))
    step_body(rs, x, y, accumulation)
    s = per.reshape(accumulation, 8 // accumulation, -1).mean(1).square().sum(1).mean().item()
    q = per.mean(0).square().sum().item()
    assert seen[0][0].item() == pytest.approx(s, rel=1e-5) and seen[0][1].item() == pytest.approx(q, rel=1e-5)
    g2, trace = estimates(s, q, 8 // accumulation, 8)
    got = rs.noise.read()
    assert got["noise_g2"] == pytest.approx(g2, rel=1e-4) and got["noise_trace"] == pytest.approx(trace, rel=1e-4)


def test_no_host_read_in_a_step_with_the_estimate_on():
    rs = rank_state(model(), 2, per_rank_world=2)  # the full estimate's arithmetic runs (as for two ranks)
    x, y = data(8)
    step_body(rs, x, y, 2)  # first step: the optimizer makes its state
    with SyncCounter() as c:
        for step in (2, 3):
            set_lr(rs.optimizer, 0.1)
            set_step(rs, step)
            step_body(rs, x, y, 2)
    assert c.count == 0, c.where
    assert rs.noise.state[2].item() > 0
