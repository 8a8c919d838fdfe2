"""One rank of the noise-scale exchange check (started by tests/dist/test_noise_exchange.py).

Every rank holds the same small data set (no BatchNorm, so each example's gradient is defined) and trains on
its own shard with step.step_body over BucketedModel with the stats slot, for each algorithm of ALGOS. The
step's two squared norms (the ranks' mean |g_r|^2, exchanged in the slot, and the exchanged gradient's) must
equal the single-process values on the same shards, from torch.func per-example gradients of the smoothed
loss; and equal again with accumulation 2 and with the loss scaled by 2^16 (a GradScaler), and within the
wire's rounding on fp16 and bf16 wires (the loss scaled by 2^16 there too); the averages hold
the same bits on every rank; a step with an injected inf leaves them as they were. Writes how many
(algo, case) checks passed. TRANSPORT=mpi (under mpirun): the grid is MpiGrid (mpi4py, the transport of
`bench allreduce --backend mpi`), the exchange synchronous.
"""

import os
import sys
import types

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.func import functional_call, grad, vmap
from workerenv import join_gloo

from torus_train.comm.buckets import BucketedModel
from torus_train.comm.groups import build_grid_groups
from torus_train.comm.hooks import TorusHookState
from torus_train.job.algorithms import ALGORITHMS
from torus_train.job.spec import JobSpec
from torus_train.job.topology import parse_grid
from torus_train.train.noise import NoiseScale, estimates
from torus_train.train.optim import build_optimizer
from torus_train.train.step import set_lr, set_step, step_body

PER_RANK = 6
BUCKET_MB = 0.0005  # about 130 floats: the model spans several buckets
SMOOTHING = 0.1


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 9), nn.Tanh(), nn.Linear(9, 5))


def data(world):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(world * PER_RANK, 12, generator=g)
    return x, torch.randint(0, 5, (world * PER_RANK,), generator=g)


def single_process(world) -> tuple[float, float]:
    """(mean over shards of |shard gradient|^2, |whole-batch gradient|^2) from per-example gradients."""
    m = model()
    params = {k: v.detach() for k, v in m.named_parameters()}
    loss = nn.CrossEntropyLoss(label_smoothing=SMOOTHING)

    def one(p, x, y):
        return loss(functional_call(m, p, (x[None],)), y[None])

    x, y = data(world)
    per = vmap(grad(one), in_dims=(None, 0, 0))(params, x, y)
    flat = torch.cat([g.reshape(len(x), -1) for g in per.values()], dim=1).double()
    shards = flat.reshape(world, PER_RANK, -1).mean(1)
    return shards.square().sum(1).mean().item(), flat.mean(0).square().sum().item()


def run_steps(groups, algo, rank, world, accumulation=1, scale=None, inf_step=False, wire=None):
    """Steps of step_body on this rank's shard: [s, q] as measured by the first, and the averages after it
    and after the last."""
    m = model()
    mode = ALGORITHMS.get(algo)
    sync = mode.asynchronous and groups.backend != "mpi"  # MpiGrid's calls stay on the training thread
    state = TorusHookState(groups, algo=mode.same_as or mode.name, compression=wire, asynchronous=sync)
    opt = build_optimizer(m, "sgd", 0.1, momentum=0.9)
    opt.use_device_lr("cpu")
    noise = NoiseScale(torch.device("cpu"), world, average_epochs=1.0)
    noise.set_epoch(100 * world * PER_RANK)
    seen = []
    update = noise.update
    noise.update = lambda v, found, b, k: (seen.append(v.clone()), update(v, found, b, k))  # type: ignore[method-assign]
    rs = types.SimpleNamespace(
        ddp=BucketedModel(m, state, BUCKET_MB, stats=True),
        optimizer=opt,
        loss_fn=nn.CrossEntropyLoss(label_smoothing=SMOOTHING),
        amp_dtype=None,
        scaler=torch.amp.GradScaler("cpu", init_scale=scale) if scale else None,
        spec=JobSpec(),
        pos=types.SimpleNamespace(global_step=0),
        skip_counts=None,
        step_now=torch.zeros((), dtype=torch.int64),
        noise=noise,
    )
    if len(rs.ddp.buckets) < 3:
        sys.exit(f"rank {rank}: only {len(rs.ddp.buckets)} buckets; the check needs several")
    x, y = data(world)
    x, y = x[rank * PER_RANK : (rank + 1) * PER_RANK], y[rank * PER_RANK : (rank + 1) * PER_RANK]
    set_lr(opt, 0.1)
    set_step(rs, 1)
    step_body(rs, x, y, accumulation)
    first = noise.state.clone()
    if inf_step:
        set_step(rs, 2)
        bad = x.clone()
        if rank == 0:
            bad[0, 0] = float("inf")
        step_body(rs, bad, y, accumulation)
    rs.ddp.close()
    return seen[0], first, noise.state.clone(), rs.skip_counts


def close(a, b, rtol=2e-5):
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def checks(groups, algo, rank, world, gather) -> int:
    s_ref, q_ref = single_process(world)
    v, first, _, _ = run_steps(groups, algo, rank, world)
    s, q = v.tolist()
    if not (close(s, s_ref) and close(q, q_ref)):
        sys.exit(f"rank {rank}: {algo}: measured s={s!r} q={q!r}, single process s={s_ref!r} q={q_ref!r}")
    g2, trace = estimates(s_ref, q_ref, PER_RANK, PER_RANK * world)
    w = first[2].item()
    if not (close(first[0].item() / w, g2, 1e-4) and close(first[1].item() / w, trace, 1e-4)):
        sys.exit(f"rank {rank}: {algo}: averages {first.tolist()} against |G|^2={g2!r} tr={trace!r}")
    every = gather(first)
    if any(not torch.equal(e.view(torch.int32), first.view(torch.int32)) for e in every):
        sys.exit(f"rank {rank}: {algo}: the averages differ between ranks: {[e.tolist() for e in every]}")
    passed = 3
    v2 = run_steps(groups, algo, rank, world, accumulation=2)[0]
    if not all(close(a, b) for a, b in zip(v2.tolist(), (s, q), strict=True)):
        sys.exit(f"rank {rank}: {algo}: accumulation 2 measured {v2.tolist()}, 1 measured {[s, q]}")
    passed += 1
    v3, first3, after, counts = run_steps(groups, algo, rank, world, scale=2.0**16, inf_step=True)
    if not all(close(a, b) for a, b in zip(v3.tolist(), (s, q), strict=True)):
        sys.exit(f"rank {rank}: {algo}: with the loss scaled by 2^16 measured {v3.tolist()}, unscaled {[s, q]}")
    if counts.tolist()[1] != 1 or not torch.equal(after, first3):
        sys.exit(f"rank {rank}: {algo}: the inf step changed the averages {first3.tolist()} -> {after.tolist()}")
    passed += 2
    for wire, rtol in (("fp16", 3e-3), ("bf16", 2e-2)):  # the slot in the wire's dtype, the loss scale out of it
        vw = run_steps(groups, algo, rank, world, scale=2.0**16, wire=wire)[0]
        if not all(close(a, b, rtol) for a, b in zip(vw.tolist(), (s, q), strict=True)):
            sys.exit(
                f"rank {rank}: {algo}: a {wire} wire with the loss scaled by 2^16 measured {vw.tolist()}, {[s, q]}"
            )
        passed += 1
    return passed


def gloo_gather(t):
    every = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(every, t)
    return every


def main():
    grid = parse_grid(os.environ["GRID"])
    if os.environ.get("TRANSPORT") == "mpi":
        from mpi4py import MPI

        from torus_train.comm.mpi.transport import MpiGrid

        torch.set_num_threads(1)
        comm = MPI.COMM_WORLD
        rank, world, groups = comm.rank, comm.size, MpiGrid(grid)
        gather = lambda t: [torch.from_numpy(a) for a in comm.allgather(t.numpy())]  # noqa: E731
    else:
        rank, world = join_gloo()
        groups, gather = build_grid_groups(grid, timeout=60), gloo_gather
    passed = sum(checks(groups, algo, rank, world, gather) for algo in os.environ["ALGOS"].split(","))
    if dist.is_initialized():
        dist.destroy_process_group()
    with open(os.environ["CHECK_OUT"] + f".{rank}", "w") as f:
        f.write(str(passed))


if __name__ == "__main__":
    main()
