"""One rank of the pipelined exchange checks (started by tests/dist/test_pipeline.py).

A model whose gradients differ per rank (every rank feeds its own data), in BucketedModel with small buckets
(so the step has many, exchanged while backward runs) and, on shared-memory rows, pieces of 1 KiB (so a bucket
crosses the row in many pieces and two are in flight). For each row transport (shared memory, gloo) and wire
precision: the pipelined exchange (comm/pipeline.py, two threads) gives bit for bit the serial exchange's
gradients, and both the plain all-reduce's mean; a step under no_sync and one after it accumulate. Then the
NCCL lanes (StreamLanes: the issue order, chunk layout and copy back of the two-stream path) run on CPU tensors
over gloo, inline as a rehearsal runs them: every call is synchronous, so the order of issue is the order of
execution, and it must match on every rank or a collective pairs wrongly.
Writes the number of checks passed to CHECK_OUT.RANK.
"""

import os
import sys
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn as nn
from workerenv import join_gloo

from torus_train.comm import pipeline
from torus_train.comm.buckets import BucketedModel
from torus_train.comm.groups import build_grid_groups
from torus_train.comm.hooks import TorusHookState
from torus_train.job.topology import parse_grid

BUCKET_MB = 0.0005  # 512-byte buckets: the model makes six


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 33), nn.ReLU(), nn.Linear(33, 7)
    )


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(5, 3, 8, 8, generator=g) * (rank + 1)


def reference(rank, world, steps=2):
    """The plain all-reduce's mean of every rank's gradients, per step."""
    m, out = model(), []
    for step in range(steps):
        m.zero_grad(set_to_none=True)
        m(batch(rank, step)).pow(2).sum().backward()
        g = torch.cat([p.grad.flatten() for p in m.parameters()])
        dist.all_reduce(g)
        out.append(g / world)
    return out


def bucketed(groups, rank, compression, pipelined, steps=2):
    """Gradients of BucketedModel per step, and which lanes it ran (None: serial)."""
    state = TorusHookState(groups, algo="torus", compression=compression, pipelined=pipelined)
    dp = BucketedModel(model(), state, BUCKET_MB)
    out = []
    for step in range(steps):
        dp.zero_grad()
        dp(batch(rank, step)).pow(2).sum().backward()
        dp.finish()
        out.append(torch.cat([p.grad.flatten() for p in dp.module.parameters()]))
    lanes = type(dp._lanes).__name__ if dp._lanes is not None else None
    if state.buckets_reduced != steps * len(dp.buckets) or len(dp.buckets) < 6:
        sys.exit(f"rank {rank}: {state.buckets_reduced} buckets reduced of {steps} x {len(dp.buckets)}")
    dp.close()
    return out, lanes


def accumulated(groups, rank, world):
    """A micro-batch under no_sync, then one exchanged: the mean of the two micro-batches' sums."""
    dp = BucketedModel(model(), TorusHookState(groups, algo="torus", pipelined=True), BUCKET_MB)
    dp.zero_grad()
    with dp.no_sync():
        dp(batch(rank, 0)).pow(2).sum().backward()
    dp(batch(rank, 1)).pow(2).sum().backward()
    dp.finish()
    got = torch.cat([p.grad.flatten() for p in dp.module.parameters()])
    dp.close()
    want = sum(reference(rank, world, steps=2))
    return ((got - want).abs().max() / want.abs().max()).item()


def close(got, want, rtol):
    return all(((a - b).abs().max() / b.abs().max()).item() <= rtol for a, b in zip(got, want, strict=True))


def thread_lanes_check(grid, rank, world, want) -> int:
    checks = 0
    for use_shm in (True, False):
        groups = build_grid_groups(grid, use_shm=use_shm, timeout=60)
        kind = groups.rows.kind
        for compression, rtol in ((None, 1e-5), ("bf16", 2e-2)):
            serial, lanes = bucketed(groups, rank, compression, pipelined=False)
            piped, lanes2 = bucketed(groups, rank, compression, pipelined=True)
            what = f"rank {rank}: rows {kind}, {compression}"
            if (lanes, lanes2) != (None, "ThreadLanes"):
                sys.exit(f"{what}: lanes {lanes}, {lanes2}")
            if not all(torch.equal(a, b) for a, b in zip(piped, serial, strict=True)):
                sys.exit(f"{what}: the pipelined exchange differs from the serial one")
            if not close(piped, want, rtol):
                sys.exit(f"{what}: the pipelined exchange is not the plain all-reduce's mean")
            checks += 1
        err = accumulated(groups, rank, world)
        if err > 1e-5:
            sys.exit(f"rank {rank}: rows {kind}: no_sync then a synced step: relative error {err:.2e}")
        groups.close()
        checks += 1
    return checks


def stream_lanes_check(grid, rank, want) -> int:
    """The NCCL lanes on CPU buckets: the rehearsal's path (plan/rehearse), the same collectives in the same order
    as on the GPU's two streams, inline."""
    groups = build_grid_groups(grid, use_shm=False, timeout=60)
    checks = 0
    with mock.patch.object(pipeline, "nccl_orders_launches", return_value=True):
        for compression, rtol in ((None, 1e-5), ("bf16", 2e-2)):
            state = TorusHookState(groups, algo="torus", compression=compression, pipelined=True)
            dp = BucketedModel(model(), state, BUCKET_MB)
            dp._lanes = pipeline.torus_lanes(state, nccl=True, cuda=False)  # what a rehearsed NCCL rank gets
            got = []
            for step in range(2):
                dp.zero_grad()
                dp(batch(rank, step)).pow(2).sum().backward()
                dp.finish()
                got.append(torch.cat([p.grad.flatten() for p in dp.module.parameters()]))
            if type(dp._lanes).__name__ != "StreamLanes" or not close(got, want, rtol):
                sys.exit(f"rank {rank}: NCCL lanes on gloo, {compression}: not the plain all-reduce's mean")
            dp.close()
            checks += 1
    groups.close()
    return checks


def main():
    rank, world = join_gloo()
    grid = parse_grid(os.environ["GRID"])
    want = reference(rank, world)
    checks = thread_lanes_check(grid, rank, world, want) + stream_lanes_check(grid, rank, want)
    dist.destroy_process_group()
    with open(os.environ["CHECK_OUT"] + f".{rank}", "w") as f:
        f.write(str(checks))


if __name__ == "__main__":
    main()
