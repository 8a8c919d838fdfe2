"""One rank of the DDP hook check (started by tests/dist/test_hook.py).

Two copies of a model with the same initial weights, one under DDP's default all-reduce and one under
torus_train's hook; every rank feeds different data, so the gradients differ per rank and a wrong
reduction (a missing rank, a sum instead of a mean, a misplaced chunk) cannot pass by accident.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torus_train.comm.groups import build_grid_groups
from torus_train.comm.hooks import TorusHookState, allreduce_hook
from torus_train.job.topology import parse_grid


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 33), nn.ReLU(),
                         nn.Linear(33, 7))


def grads(ddp, rank, steps=2):
    out = []
    for step in range(steps):
        ddp.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(100 * rank + step)
        x = torch.randn(5, 3, 8, 8, generator=g) * (rank + 1)
        ddp(x).pow(2).sum().backward()
        out.append(torch.cat([p.grad.flatten() for p in ddp.parameters()]))
    return out


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    grid = parse_grid(os.environ["GRID"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    groups = build_grid_groups(grid, timeout=60)
    # small buckets so the model spans several (the hook runs per bucket, buckets finish out of order)
    ref = grads(DDP(model(), bucket_cap_mb=0.002), rank)
    local = grads(model(), rank)
    if all(torch.allclose(a, b) for a, b in zip(ref, local)):
        sys.exit(f"rank {rank}: per-rank gradients equal the averaged ones; the check would be blind")
    checks = 0
    for algo in ("torus", "hierarchical", "flat"):
        for compression, rtol in ((None, 1e-5), ("fp16", 2e-3), ("bf16", 2e-2)):
            ddp = DDP(model(), bucket_cap_mb=0.002)
            state = TorusHookState(groups, algo=algo, compression=compression)
            ddp.register_comm_hook(state, allreduce_hook)
            got = grads(ddp, rank)
            state.close()
            for a, b in zip(got, ref):
                err = ((a - b).abs() / (b.abs().max() + 1e-12)).max().item()
                if err > rtol:
                    sys.exit(f"rank {rank}: hook {algo}/{compression}: relative error {err:.2e} > {rtol}")
            if state.buckets_reduced < 3:  # 2 steps, the second with rebuilt (several) buckets
                sys.exit(f"rank {rank}: hook {algo}: only {state.buckets_reduced} buckets went through the hook")
            checks += 1
    dist.destroy_process_group()
    with open(os.environ["CHECK_OUT"] + f".{rank}", "w") as f:
        f.write(str(checks))


if __name__ == "__main__":
    main()
