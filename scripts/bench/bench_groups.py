#!/usr/bin/env python3
"""Time one rank's creation of all row and column groups, one group at a time against two calls, and against
torch's DeviceMesh, on torch's one-process fake backend (on which `torus-train plan rehearse` builds them), at 8
and 2,176 ranks side by side, with a one-row grid (8x1) where the mesh differs.

    python scripts/bench/bench_groups.py                                 # grids 2x4, 32x68 and 8x1, 20 rounds
    python scripts/bench/bench_groups.py --grids 2x4,32x68 --rounds 20 --json bench_groups.json

Methods (torus_train.comm.groups.build_grid_groups(method=...)):
- per-group: one dist.new_group per row and per column (Y + X calls, 100 at 32x68);
- enumerate: two dist.new_subgroups_by_enumeration calls (torch 2.14 runs one new_group per group inside);
- split: two dist.split_group calls. torch allows it only with a device bound at init and an accelerator;
  this script emulates one (the fake backend supports splitting and never touches the device) so the
  bookkeeping of the two-call path is timed here; on NCCL it is 2 communicator splits instead of 100.
- mesh, mesh-unbound: torch's init_device_mesh(device, (Y, X), mesh_dim_names=("col", "row")), the
  alternative issue 45 weighed, with the device bound as for split and without it (then the mesh makes one
  new_group per row and per column). Its groups get torch's default timeout, not the job's: the script
  builds with --timeout and prints what each row group got where the backend shows it (a split group).

`creations` counts the group-making calls that reach torch.distributed (each split_group and each new_group,
inside new_subgroups_by_enumeration and DeviceMesh too; each is collective over the world); `world` says
whether the row or column group handed back is the world's own group (the mesh does that for a grid
dimension that spans the world, so a one-row grid's exchange would share the world's communicator).
The fake backend does no communication, so the times are each rank's own Python work per build. A rank's
figure is the median over --rounds builds, each as a different rank of the grid (rows and columns vary).
The ratio is per-group / this.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from unittest import mock

METHODS = ("per-group", "enumerate", "split", "mesh", "mesh-unbound")
BOUND = ("split", "mesh")
"""The methods built with a device bound at init (emulated), as NCCL's bootstrap binds one."""


@contextmanager
def fake_world(rank: int, size: int, emulate_device: bool, timeout: float):
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    patches = []
    if emulate_device:  # split_group asks for an accelerator and a bound device; the fake backend uses neither
        patches = [
            mock.patch("torch.accelerator.is_available", return_value=True),
            mock.patch("torch.accelerator.current_accelerator", return_value=torch.device("cuda")),
        ]
    for p in patches:
        p.start()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=size, timeout=timedelta(seconds=timeout))
    if emulate_device:
        dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
    try:
        yield
    finally:
        dist.destroy_process_group()
        for p in patches:
            p.stop()


@contextmanager
def counting(calls: list):
    """Append the name of every group-making call that reaches torch.distributed: ours call it as dist.X,
    new_subgroups_by_enumeration calls distributed_c10d's new_group, DeviceMesh its own imported names."""
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    from torch.distributed import distributed_c10d

    def counted(name, original):
        def call(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return call

    with ExitStack() as stack:
        for module in (dist, distributed_c10d, device_mesh):
            for name in ("new_group", "split_group"):
                if hasattr(module, name):
                    stack.enter_context(mock.patch.object(module, name, counted(name, getattr(module, name))))
        yield


def build(grid, method: str, timeout: float):
    """(row group, column group) of this rank, made by `method`."""
    from torus_train.comm.groups import build_grid_groups

    if method.startswith("mesh"):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda" if method in BOUND else "cpu", (grid.y, grid.x), mesh_dim_names=("col", "row"))
        return mesh.get_group("row"), mesh.get_group("col")
    # groups of one rank too, as on NCCL and as the mesh always makes them, so that the counts compare
    g = build_grid_groups(grid, use_shm=False, method=method, timeout=timeout, singletons=True)
    return g.row_group, g.col_group


def group_timeout(pg) -> float | None:
    """The group's timeout in seconds where the backend shows it (a split group), else None."""
    import torch

    try:
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


def time_method(grid, method: str, rounds: int, timeout: float = 60.0) -> dict:
    import torch.distributed as dist

    seconds, calls, world, got = [], [], False, None
    for i in range(rounds):
        rank = (i * 997) % grid.size  # a different rank each round
        with fake_world(rank, grid.size, method in BOUND, timeout), counting(calls):
            t = time.perf_counter()
            row_group, col_group = build(grid, method, timeout)
            seconds.append(time.perf_counter() - t)
            row, col = grid.position(rank)
            if dist.get_process_group_ranks(row_group) != grid.row_ranks(row) or dist.get_process_group_ranks(
                col_group
            ) != grid.col_ranks(col):
                raise SystemExit(f"bench_groups: {method} gave rank {rank} the wrong row or column group")
            default = dist.distributed_c10d._get_default_group()
            world = world or row_group is default or col_group is default
            got = group_timeout(row_group if row_group is not default else col_group)
    api = {"per-group": grid.x + grid.y, "enumerate": 2, "split": 2, "mesh": 1, "mesh-unbound": 1}[method]
    return {
        "grid": str(grid),
        "ranks": grid.size,
        "method": method,
        "api_calls": api,
        "collective_calls": len(calls) // rounds,
        "world_group_reused": world,
        "timeout_asked_s": timeout,
        "timeout_got_s": got,
        "seconds": statistics.median(seconds),
        "rounds": rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grids", default="2x4,32x68,8x1", help="comma-separated XxY grids")
    ap.add_argument("--rounds", type=int, default=20, help="builds per grid and method (median shown)")
    ap.add_argument("--timeout", type=float, default=60.0, help="the job's group timeout, seconds")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    import torch

    from torus_train.job.topology import Grid, parse_grid

    grids = [parse_grid(g) for g in args.grids.split(",")]
    grids = [Grid(g.x, g.y, 4) for g in grids]
    rows = [time_method(g, m, args.rounds, args.timeout) for g in grids for m in METHODS]
    print(
        f"# row and column groups on the fake backend (torch {torch.__version__}), one rank's build, "
        f"median of {args.rounds}"
    )
    print(
        f"{'grid':>6} {'ranks':>6} {'method':>12} {'API calls':>9} {'creations':>9} {'world':>5} "
        f"{'timeout s':>9} {'ms':>8} {'per-group/this':>14}"
    )
    for r in rows:
        base = next(x for x in rows if x["grid"] == r["grid"] and x["method"] == "per-group")
        r["ratio_vs_per_group"] = base["seconds"] / r["seconds"]
        got = "-" if r["timeout_got_s"] is None else f"{r['timeout_got_s']:g}"
        print(
            f"{r['grid']:>6} {r['ranks']:>6} {r['method']:>12} {r['api_calls']:>9} {r['collective_calls']:>9} "
            f"{'yes' if r['world_group_reused'] else 'no':>5} {got:>9} {r['seconds'] * 1e3:>8.2f} "
            f"{r['ratio_vs_per_group']:>14.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "backend": "fake", "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
