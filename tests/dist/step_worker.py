"""One rank of the owned-bucket step check (started by tests/dist/test_owned_step.py).

Two copies of a small model (conv, BatchNorm, linear: channels_last weights, several buckets) with the same
initial weights take the same steps on data that differs per rank, so the gradients differ per rank and a
wrong reduction cannot pass by accident:
- the reference: DDP (its reducer and buckets) with comm/hooks.py's reduce_bucket as comm hook, or DDP's own all-reduce for
  comm.algo = ddp, and the optimizer step of train/step.py (no_sync on the micro-batches before the last);
- step.step_body, the step the loop runs eagerly and captures on CUDA, over comm/buckets.py's BucketedModel.
Both take LARS with the LR in a device tensor. Writes how many (algo, accumulation) cases ended with bit-equal
parameters after STEPS steps.
"""

import contextlib
import os
import sys
import types

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from workerenv import join_gloo

from torus_train.comm.buckets import BucketedModel
from torus_train.comm.groups import build_grid_groups
from torus_train.comm.hooks import TorusHookState, reduce_bucket
from torus_train.job.algorithms import ALGORITHMS
from torus_train.job.spec import JobSpec
from torus_train.job.topology import parse_grid
from torus_train.train.optim import build_optimizer
from torus_train.train.step import nonfinite_flag, set_lr, set_step, step_body, step_unless

STEPS = 3
BUCKET_MB = 0.004  # about 1,000 floats: the model spans several buckets


def model():
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 33),
        nn.ReLU(),
        nn.Linear(33, 7),
    )
    return m.to(memory_format=torch.channels_last)


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    x = (torch.randn(8, 3, 10, 10, generator=g) * (rank + 1)).contiguous(memory_format=torch.channels_last)
    return x, torch.randint(0, 7, (8,), generator=g)


def hook_state(groups, algo):
    """As train/build.py's wrap_ddp makes it for comm.algo = algo."""
    mode = ALGORITHMS.get(algo)
    return TorusHookState(groups, algo=mode.same_as or mode.name, asynchronous=mode.asynchronous)


def reduce_hook(state, bucket):
    """A DDP comm hook averaging the bucket with comm/hooks.py's reduce_bucket, inside the hook."""
    fut = torch.futures.Future()
    fut.set_result(reduce_bucket(state, bucket.buffer()))
    return fut


def optimizer(m):
    opt = build_optimizer(m, "lars", 0.5, weight_decay=5e-4)
    opt.use_device_lr("cpu")
    return opt


def reference(groups, algo, accumulation, rank):
    """The step as it ran under DDP."""
    m = model()
    ddp = DDP(m, bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=True, broadcast_buffers=False)
    state = None
    if ALGORITHMS.get(algo).hook:
        state = hook_state(groups, algo)
        ddp.register_comm_hook(state, reduce_hook)
    opt, loss_fn = optimizer(m), nn.CrossEntropyLoss()
    for step in range(STEPS):
        set_lr(opt, 0.5 / (step + 1))
        x, y = batch(rank, step)
        opt.zero_grad(set_to_none=True)
        for i, (xx, yy) in enumerate(zip(x.chunk(accumulation), y.chunk(accumulation), strict=True)):
            with ddp.no_sync() if i < accumulation - 1 else contextlib.nullcontext():
                (loss_fn(ddp(xx), yy) / accumulation).backward()
        step_unless(opt, nonfinite_flag(m))
    if state is not None:
        state.close()
    return m


def owned(groups, algo, accumulation, rank):
    """step_body over owned buckets, as the loop runs it."""
    m = model()
    state = hook_state(groups, algo)
    spec = JobSpec()
    rs = types.SimpleNamespace(
        ddp=BucketedModel(m, state, BUCKET_MB),
        optimizer=optimizer(m),
        loss_fn=nn.CrossEntropyLoss(),
        amp_dtype=None,
        scaler=None,
        spec=spec,
        pos=types.SimpleNamespace(global_step=0),
        skip_counts=None,
        step_now=torch.zeros((), dtype=torch.int64),
    )
    if len(rs.ddp.buckets) < 3:
        sys.exit(f"rank {rank}: only {len(rs.ddp.buckets)} buckets; the check needs several")
    for step in range(STEPS):
        set_lr(rs.optimizer, 0.5 / (step + 1))
        set_step(rs, step + 1)
        x, y = batch(rank, step)
        step_body(rs, x, y, accumulation)
    rs.ddp.close()
    if rs.skip_counts.tolist()[1] != 0:
        sys.exit(f"rank {rank}: a step was counted as skipped")
    return m


def main():
    rank, _ = join_gloo()
    groups = build_grid_groups(parse_grid(os.environ["GRID"]), timeout=60)
    same = 0
    for algo in os.environ["ALGOS"].split(","):
        for accumulation in (1, 2):
            a, b = reference(groups, algo, accumulation, rank), owned(groups, algo, accumulation, rank)
            start = dict(model().named_parameters())
            moved = all(not torch.equal(p, start[k]) for k, p in a.named_parameters())
            if not moved:
                sys.exit(f"rank {rank}: {algo}: a parameter did not move; the check would be blind")
            diff = [
                k
                for (k, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True)
                if not torch.equal(p, q)
            ]
            if diff:
                worst = max(
                    (p - q).abs().max().item()
                    for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True)
                )
                sys.exit(
                    f"rank {rank}: {algo} x{accumulation}: parameters differ from DDP's in {diff[:3]} "
                    f"(max |diff| {worst:.2e})"
                )
            same += 1
    dist.destroy_process_group()
    with open(os.environ["CHECK_OUT"] + f".{rank}", "w") as f:
        f.write(str(same))


if __name__ == "__main__":
    main()
