"""One rank of the bucket exchange checks (started by tests/dist/test_hook.py).

CHECK=grads (default): two copies of a model with the same initial weights, one under DDP's default all-reduce and
one under comm/buckets.py's BucketedModel with the torus exchange (comm/hooks.py); every rank feeds different
data, so the gradients differ per rank and a wrong reduction (a missing rank, a sum instead of a mean, a
misplaced chunk) cannot pass by accident. Each algorithm and wire precision runs asynchronously (the
background thread) and synchronously, serial (the two lanes have tests/dist/pipeline_worker.py).
CHECK=layout: exchange_cuda, the NCCL path's chunk layout (X equal chunks, zero padding, compression,
reduce-scatter / all_reduce / all-gather), called on CPU tensors over gloo, which has the
same three collectives: lengths that X divides and that it does not, with and without a wire dtype, against
the exact mean of every rank's values.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from workerenv import join_gloo

from torus_train.comm.buckets import BucketedModel
from torus_train.comm.groups import build_grid_groups
from torus_train.comm.hooks import TorusHookState, exchange_cuda
from torus_train.job.algorithms import runnable
from torus_train.job.topology import parse_grid


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 33), nn.ReLU(), nn.Linear(33, 7)
    )


def grads(ddp, rank, steps=2):
    owned = isinstance(ddp, BucketedModel)
    module = ddp.module if owned else ddp
    out = []
    for step in range(steps):
        ddp.zero_grad() if owned else ddp.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(100 * rank + step)
        x = torch.randn(5, 3, 8, 8, generator=g) * (rank + 1)
        ddp(x).pow(2).sum().backward()
        if owned:
            ddp.finish()  # join the exchange (DDP's reducer joins inside backward)
        out.append(torch.cat([p.grad.flatten() for p in module.parameters()]))
    return out


def layout_check(groups, rank, world) -> int:
    def values(r, n):  # different on every rank and element, exactly representable in fp16
        return (torch.arange(n, dtype=torch.float32) % 17 + 1) * (r + 1) / 8

    checks = 0
    x = groups.grid.x
    for n in (1, x - 1 or 1, 7, 12 * x, 1001):
        expected = sum(values(r, n) for r in range(world)) / world
        for compression, rtol in ((None, 1e-6), ("fp16", 2e-3), ("bf16", 2e-2)):
            state = TorusHookState(groups, algo="torus", compression=compression)
            buffer = values(rank, n)
            before = buffer.data_ptr()
            got = exchange_cuda(state, buffer)
            err = ((got - expected).abs() / expected.abs().max()).max().item()
            if got is not buffer or buffer.data_ptr() != before:
                sys.exit(f"rank {rank}: n={n} {compression}: the bucket was not averaged in place")
            if err > rtol or state.buckets_reduced != 1:
                sys.exit(
                    f"rank {rank}: n={n} {compression}: relative error {err:.2e} > {rtol} "
                    f"(buckets reduced {state.buckets_reduced})"
                )
            state.close()
            checks += 1
    return checks


def grads_check(groups, rank) -> int:
    # small buckets so the model spans several (exchanged per bucket, buckets finish out of order)
    ref = grads(DDP(model(), bucket_cap_mb=0.002), rank)
    local = grads(model(), rank)
    if all(torch.allclose(a, b) for a, b in zip(ref, local, strict=True)):
        sys.exit(f"rank {rank}: per-rank gradients equal the averaged ones; the check would be blind")
    checks = 0
    for algo in runnable():
        for compression, rtol in ((None, 1e-5), ("fp16", 2e-3), ("bf16", 2e-2)):
            for asynchronous in (True, False):
                state = TorusHookState(
                    groups, algo=algo, compression=compression, asynchronous=asynchronous, pipelined=False
                )
                dp = BucketedModel(model(), state, bucket_mb=0.002)
                got = grads(dp, rank)
                dp.close()
                what = f"buckets {algo}/{compression}/{'async' if asynchronous else 'sync'}"
                for a, b in zip(got, ref, strict=True):
                    err = ((a - b).abs() / (b.abs().max() + 1e-12)).max().item()
                    if err > rtol:
                        sys.exit(f"rank {rank}: {what}: relative error {err:.2e} > {rtol}")
                if state.buckets_reduced < 3:  # 2 steps, the second with rebuilt (several) buckets
                    sys.exit(f"rank {rank}: {what}: only {state.buckets_reduced} buckets were exchanged")
                checks += 1
    return checks


def main():
    rank, world = join_gloo()
    grid = parse_grid(os.environ["GRID"])
    groups = build_grid_groups(grid, timeout=60)
    check = os.environ.get("CHECK", "grads")
    checks = layout_check(groups, rank, world) if check == "layout" else grads_check(groups, rank)
    dist.destroy_process_group()
    with open(os.environ["CHECK_OUT"] + f".{rank}", "w") as f:
        f.write(str(checks))


if __name__ == "__main__":
    main()
