"""The ETA's prior (train/build.time_step) is timed in the training precision: the loader's image dtype and
autocast at model.precision, as the step runs, so the kernels cuDNN autotunes before the first step are the
loop's, not fp32's. On the CPU ranks run fp32; a GPU rank's precision is stood in by the dtypes it resolves to."""

from __future__ import annotations

import torch
import torch.nn as nn

from torus_train.check.smallrun import small_spec
from torus_train.train import build


class Wrapped(nn.Module):
    """What time_step asks of the owned buckets: the module, a call, zero_grad, finish (the exchange)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module, self.finished = module, 0

    def forward(self, x):
        return self.module(x)

    def finish(self):
        self.finished += 1


def seen_by_the_model(monkeypatch, tmp_path, amp, image_dtype):
    """(input dtype, autocast on, the conv's output dtype) the model saw in time_step's passes."""
    monkeypatch.setattr(build, "autocast_dtype", lambda spec, device: amp)
    monkeypatch.setattr(build, "image_dtype", lambda spec, device: image_dtype)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
    model(torch.zeros(1, 3, 8, 8))  # the lazy layer made
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, torch.is_autocast_enabled("cpu"), o.dtype)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dp = Wrapped(model)
    spec = small_spec(tmp_path, 2, 1, image_size=8)
    seconds = build.time_step(dp, spec, torch.device("cpu"), micro_batch=2, accumulation=3)
    assert seconds > 0 and dp.finished == 2 and len(seen) == 2
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the statistics put back
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    return seen[-1]


def test_the_prior_is_timed_in_the_training_precision(monkeypatch, tmp_path):
    assert seen_by_the_model(monkeypatch, tmp_path, torch.bfloat16, "bfloat16") == (
        torch.bfloat16,
        True,
        torch.bfloat16,
    )


def test_fp32_and_cpu_ranks_time_without_autocast(monkeypatch, tmp_path):
    assert seen_by_the_model(monkeypatch, tmp_path, None, "float32") == (torch.float32, False, torch.float32)


def test_the_step_precision_resolves_per_device(tmp_path):
    spec = small_spec(tmp_path, 2, 1, extra=("model.precision=fp16",))
    assert build.autocast_dtype(spec, torch.device("cpu")) is None  # CPU ranks run fp32
    assert build.autocast_dtype(spec, torch.device("cuda")) is torch.float16  # the name only: no GPU touched
