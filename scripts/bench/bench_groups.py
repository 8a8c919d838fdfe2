#!/usr/bin/env python3
"""Time one rank's creation of all row and column groups, one group at a time against two calls, on torch's
one-process fake backend (on which `torus-train plan rehearse` builds them), at 8 and 2,176 ranks side by side.

    python scripts/bench/bench_groups.py                                 # grids 2x4 and 32x68, 20 rounds each
    python scripts/bench/bench_groups.py --grids 2x4,32x68 --rounds 20 --json bench_groups.json

Methods (torus_train.comm.groups.build_grid_groups(method=...)):
- per-group: one dist.new_group per row and per column (Y + X calls, 100 at 32x68);
- enumerate: two dist.new_subgroups_by_enumeration calls (torch 2.14 runs one new_group per group inside);
- split: two dist.split_group calls. torch allows it only with a device bound at init and an accelerator;
  this script emulates one (the fake backend supports splitting and never touches the device) so the
  bookkeeping of the two-call path is timed here; on NCCL it is 2 communicator splits instead of 100.

The fake backend does no communication, so these times are each rank's own Python work per build; at scale
the difference that matters is the number of collective communicator splits, printed as `collective calls`.
A rank's figure is the median over --rounds builds, each as a different rank of the grid (rows and columns
vary). The ratio is per-group / two-call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from unittest import mock


@contextmanager
def fake_world(rank: int, size: int, emulate_device: bool):
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
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=size)
    if emulate_device:
        dist.distributed_c10d._get_default_group().bound_device_id = torch.device("cuda", 0)
    try:
        yield
    finally:
        dist.destroy_process_group()
        for p in patches:
            p.stop()


def time_method(grid, method: str, rounds: int) -> dict:
    import torch.distributed as dist

    from torus_train.comm.groups import build_grid_groups

    seconds = []
    for i in range(rounds):
        rank = (i * 997) % grid.size  # a different rank each round
        with fake_world(rank, grid.size, emulate_device=(method == "split")):
            t = time.perf_counter()
            g = build_grid_groups(grid, use_shm=False, method=method)
            seconds.append(time.perf_counter() - t)
            row, col = grid.position(rank)
            if dist.get_process_group_ranks(g.row_group) != grid.row_ranks(row) or dist.get_process_group_ranks(
                g.col_group
            ) != grid.col_ranks(col):
                raise SystemExit(f"bench_groups: {method} gave rank {rank} the wrong row or column group")
    calls = {"per-group": grid.x + grid.y, "enumerate": grid.x + grid.y, "split": 2}[method]
    api = {"per-group": grid.x + grid.y, "enumerate": 2, "split": 2}[method]
    return {
        "grid": str(grid),
        "ranks": grid.size,
        "method": method,
        "api_calls": api,
        "collective_calls": calls,
        "seconds": statistics.median(seconds),
        "rounds": rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grids", default="2x4,32x68", help="comma-separated XxY grids")
    ap.add_argument("--rounds", type=int, default=20, help="builds per grid and method (median shown)")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    import torch

    from torus_train.job.topology import Grid, parse_grid

    grids = [parse_grid(g) for g in args.grids.split(",")]
    grids = [Grid(g.x, g.y, 4) for g in grids]
    methods = ["per-group", "enumerate", "split"]
    rows = [time_method(g, m, args.rounds) for g in grids for m in methods]
    print(
        f"# row and column groups on the fake backend (torch {torch.__version__}), one rank's build, "
        f"median of {args.rounds}"
    )
    print(
        f"{'grid':>6} {'ranks':>6} {'method':>10} {'API calls':>9} {'collective':>10} {'ms':>8} {'per-group/this':>14}"
    )
    for r in rows:
        base = next(x for x in rows if x["grid"] == r["grid"] and x["method"] == "per-group")
        r["ratio_vs_per_group"] = base["seconds"] / r["seconds"]
        print(
            f"{r['grid']:>6} {r['ranks']:>6} {r['method']:>10} {r['api_calls']:>9} {r['collective_calls']:>10} "
            f"{r['seconds'] * 1e3:>8.2f} {r['ratio_vs_per_group']:>14.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "backend": "fake", "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
