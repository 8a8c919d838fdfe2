"""Side by side under mpirun: OpenMPI's Allreduce and the torus replayed in Python and in C (mpi_native.c).

    mpirun -np 4 --oversubscribe python scripts/experiments/mpi_replay_bench.py --grid 2x2
    mpirun -np 8 --oversubscribe python scripts/experiments/mpi_replay_bench.py --grid 2x4 --sizes 64K,1M

Every variant runs on the same float32 tensor through torus_train.comm.algos.allreduce; the variants take turns
in shuffled order, `--rounds` blocks of `--iters` calls each (after a barrier), and the median block is printed
per size with the ratios to flat (busbw ratio = time ratio: same size, same ranks). The results of the two
replays are compared bit for bit first.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # mpi_native.py, beside this script


def main() -> None:
    from mpi4py import MPI
    from mpi_native import NativeMpiGrid

    from torus_train.bench.allreduce import parse_size
    from torus_train.comm.algos import allreduce
    from torus_train.comm.mpi.transport import MpiGrid
    from torus_train.job.topology import parse_grid

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="2x2")
    ap.add_argument("--sizes", default="4K,64K,256K,1M,4M,16M")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    grid = parse_grid(args.grid)
    comm = MPI.COMM_WORLD
    grids = {"python": MpiGrid(grid), "native": NativeMpiGrid(grid)}
    if grids["native"].native is None:
        sys.exit(f"no native replay here: {grids['native'].notes[-1]}")
    rng = random.Random(1)
    if comm.rank == 0:
        print(f"# grid {args.grid}, {comm.size} ranks; median of {args.rounds} rounds x {args.iters} calls, us")
        print(f"# {'size':>10} {'flat':>9} {'torus/py':>9} {'torus/C':>9} {'py/flat':>8} {'C/flat':>7}")
    for size in args.sizes.split(","):
        nbytes = parse_size(size, "--sizes")
        n = max(1, nbytes // 4)
        check = {}
        for name, g in grids.items():
            t = torch.arange(n, dtype=torch.float32).remainder_(97).add_(comm.rank)
            allreduce(t, "torus", g)
            check[name] = t
        if not torch.equal(check["python"], check["native"]):
            sys.exit(f"rank {comm.rank}: the two replays differ at {size}")
        t = torch.ones(n)
        variants = {
            "flat": (t, "flat", grids["python"]),
            "python": (t, "torus", grids["python"]),
            "native": (t, "torus", grids["native"]),
        }
        times = {k: [] for k in variants}
        for call in variants.values():
            for _ in range(5):
                allreduce(*call)
        for _ in range(args.rounds):
            order = list(variants.items())
            rng.shuffle(order)
            for k, call in order:
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    allreduce(*call)
                times[k].append((time.perf_counter() - t0) / args.iters * 1e6)
            t.fill_(1.0)  # keep the values finite
        worst = {k: comm.allreduce(statistics.median(v), op=MPI.MAX) for k, v in times.items()}
        if comm.rank == 0:
            f, p, c = worst["flat"], worst["python"], worst["native"]
            print(f"  {nbytes:>10} {f:9.1f} {p:9.1f} {c:9.1f} {f / p:8.2f} {f / c:7.2f}", flush=True)


if __name__ == "__main__":
    main()
