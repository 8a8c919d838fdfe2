"""One rank of the multi-process all-reduce checks (started by tests/dist/test_allreduce.py).

Checks every algorithm, on shared-memory rows and on backend rows (gloo; MPI has only the latter), for ragged sizes and three dtypes: the
result must be bitwise identical on every rank and within tolerance of a float64 sum computed from the inputs'
formula. On MPI with NATIVE=1, the C replay runs too and must equal the Python replay bit for bit. Exits non-zero with a message on the first failure; writes the number of checks to $CHECK_OUT.
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from torus_train.bench.allreduce import EPS, pattern
from torus_train.comm.algos import ALGORITHMS, allreduce
from torus_train.job.topology import parse_grid

SIZES = [1, 2, 7, 97, 1009, 65537]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    grid = parse_grid(os.environ["GRID"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    if os.environ.get("BACKEND", "gloo") == "mpi":
        from torus_train.comm.mpi.transport import MpiGrid
        variants = {"mpi": MpiGrid(grid, native=False)}  # the Python replay
        if os.environ.get("NATIVE") == "1":  # and the C one, which must give bitwise the same results
            variants["mpi-native"] = MpiGrid(grid, native=True)
    else:
        from torus_train.comm.groups import build_grid_groups
        variants = {"shm": build_grid_groups(grid, use_shm=True, timeout=60),
                    "gloo": build_grid_groups(grid, use_shm=False, timeout=60)}
    # small pieces so that multi-piece tensors are exercised too
    checks, first = 0, {}
    for vname, comm in variants.items():
        for algo in ALGORITHMS:
            for dtype in DTYPES:
                for n in SIZES:
                    t = pattern(torch, rank, n, dtype)
                    allreduce(t, algo, comm)
                    ref = sum(pattern(torch, r, n, dtype).double() for r in range(world))
                    tol = EPS[str(dtype).split(".")[1]] * 0.5 * world * (world + 1) + 1e-12
                    err = (t.double() - ref).abs().max().item()
                    gathered = [torch.empty_like(t) for _ in range(world)]
                    dist.all_gather(gathered, t)
                    same = all(torch.equal(g.view(torch.int16) if g.element_size() == 2 else g,
                                           t.view(torch.int16) if t.element_size() == 2 else t) for g in gathered)
                    where = f"{vname} {algo} {dtype} n={n} grid {grid}"
                    if err > tol:
                        sys.exit(f"rank {rank}: {where}: max error {err} > tolerance {tol}")
                    if not same:
                        sys.exit(f"rank {rank}: {where}: ranks hold different results")
                    if vname.startswith("mpi") and not torch.equal(first.setdefault((algo, dtype, n), t.clone()), t):
                        sys.exit(f"rank {rank}: {where}: differs from the Python replay's result")
                    if vname == "mpi-native" and world > 1:  # float32 in C; half types (no MPI sum) in Python
                        kind = comm.replay_kind(ALGORITHMS[algo], comm.buffer(t))
                        if kind != ("native" if dtype == torch.float32 else "python"):
                            sys.exit(f"rank {rank}: {where}: replayed by {kind}")
                    checks += 1
        base = torch.ones(8)
        allreduce(base[:4], "torus", comm)  # MPI caches views under (address, 4 elements, float32)
        try:  # a strided view with the same address, length and dtype must not reuse them
            allreduce(base[::2], "torus", comm)
            sys.exit(f"rank {rank}: {vname}: a strided tensor was reduced instead of refused")
        except ValueError:
            checks += 1
        comm.close()
    dist.destroy_process_group()
    with open(os.environ["CHECK_OUT"] + f".{rank}", "w") as f:
        f.write(str(checks))


if __name__ == "__main__":
    main()
