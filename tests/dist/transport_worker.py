"""One rank of the shared transport test (started by tests/dist/test_transports.py).

Runs every runnable algorithm of torus_train.job.algorithms over each transport named in TRANSPORTS
(gloo: GridGroups with rows on their process group; shm: GridGroups with rows in shared memory; mpi: MpiGrid,
the Python replay; mpi-native: scripts/experiments/mpi_native.py's C replay), for ragged sizes and three dtypes, and checks:
- exact: small integer inputs, whose sums every dtype holds exactly, give the plain sum, bit for bit;
- rounding: fractional inputs land within tolerance of a float64 sum and are bitwise equal on every rank
  (MPI: the C replay equal to the Python one, and replayed by C for float32, Python for half types);
- the operations an algorithm calls are the ones its table entry declares (`uses`);
- a strided tensor is refused (MPI caches views by address, length and dtype);
- the transport (and its row exchange) implements the Protocols of torus_train.comm.transport.
REGISTER=path.py runs that file first (it registers more algorithms: docs/extending.md's example).
Exits non-zero naming the rank, transport, algorithm, dtype and size on the first failure; writes the number of
checks per transport to $CHECK_OUT.<rank> as JSON.
"""

import json
import os
import runpy
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from torus_train.bench.allreduce import EPS
from torus_train.bench.sweep import pattern
from torus_train.comm.algos import algorithm, allreduce
from torus_train.comm.transport import RowExchange, Transport
from torus_train.job.algorithms import ALGORITHMS, OPERATIONS, runnable
from torus_train.job.topology import parse_grid

SIZES = [1, 2, 7, 97, 1009, 65537]  # 65537: many pieces of a shared-memory row (TORUS_TRAIN_SHM_PIECE_MB)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def small_ints(rank: int, n: int, dtype) -> torch.Tensor:
    """Integers in [-4, 4]: a sum over up to 28 ranks stays within what bfloat16 holds exactly (256)."""
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 7 + rank * 3 + (i // 5) * rank) % 9 - 4).to(dtype)


def words(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t


class Spy:
    """The transport, recording which contract operations an algorithm calls."""

    def __init__(self, comm):
        self._comm, self.called = comm, set()

    def __getattr__(self, name):
        value = getattr(self._comm, name)
        if name in OPERATIONS:
            self.called.add(name)
        return value


def build(name: str, grid):
    comm = _build(name, grid)
    rows = getattr(comm, "rows", None)  # GridGroups' row exchange (MpiGrid does its rows itself)
    if not isinstance(comm, Transport) or (rows is not None and not isinstance(rows, RowExchange)):
        raise SystemExit(f"rank {comm.rank}: {name}: {type(comm).__name__} does not implement the contract")
    return comm


def _build(name: str, grid):
    if name == "mpi":
        from torus_train.comm.mpi.transport import MpiGrid

        return MpiGrid(grid)  # the Python replay
    if name == "mpi-native":  # the C replay, kept in scripts/experiments/ for the recorded figures
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "experiments"))
        from mpi_native import NativeMpiGrid

        return NativeMpiGrid(grid, required=True)
    from torus_train.comm.groups import build_grid_groups

    comm = build_grid_groups(grid, use_shm=name == "shm", timeout=60)
    if name == "shm" and grid.x > 1 and comm.rows.kind != "shm":
        raise SystemExit(f"rank {comm.rank}: shm asked for but the row exchange is {comm.rows.kind}")
    return comm


def check_uses(rank: int, tname: str, name: str, comm, grid) -> int:
    """The operations `name` calls on a large tensor, on some rank, equal its entry's `uses` (when every phase
    runs; hierarchical's column phase runs on the row leaders only)."""
    if grid.x < 2 or grid.y < 2:
        return 0
    spy = Spy(comm)
    t = small_ints(rank, 1009, torch.float32)
    algorithm(name)(comm.buffer(t), spy)  # directly, not through run(): MPI then executes, not records
    declared = set(ALGORITHMS.get(name).uses)
    everyone = [None] * grid.size
    dist.all_gather_object(everyone, spy.called)
    called = set().union(*everyone)
    if called != declared:
        sys.exit(f"rank {rank}: {tname} {name}: calls {sorted(called)}, its entry declares {sorted(declared)}")
    return 1


def check_one(rank, world, tname, name, comm, dtype, n, replays, results) -> None:
    where = f"rank {rank}: {tname} {name} {dtype} n={n} grid {comm.grid}"
    t = small_ints(rank, n, dtype)
    allreduce(t, name, comm)
    exact = sum(small_ints(r, n, torch.float64) for r in range(world)).to(dtype)
    if not torch.equal(words(t), words(exact)):
        bad = int((t != exact).sum())
        sys.exit(f"{where}: {bad} elements differ from the plain sum of integer inputs")

    t = pattern(rank, n, dtype)
    allreduce(t, name, comm)
    ref = sum(pattern(r, n, dtype).double() for r in range(world))
    tol = EPS[str(dtype).split(".")[1]] * 0.5 * world * (world + 1) + 1e-12
    err = (t.double() - ref).abs().max().item()
    if err > tol:
        sys.exit(f"{where}: max error {err} > tolerance {tol}")
    results.append((where, t.double()))  # compared across ranks at once, by same_on_every_rank
    if tname.startswith("mpi") and not torch.equal(replays.setdefault((name, dtype, n), t.clone()), t):
        sys.exit(f"{where}: differs from the Python replay's result")
    if tname == "mpi-native" and world > 1:  # float32 in C; half types (no MPI sum) in Python
        kind = comm.replay_kind(algorithm(name), comm.buffer(t))
        if kind != ("native" if dtype == torch.float32 else "python"):
            sys.exit(f"{where}: replayed by {kind}")


def same_on_every_rank(results, world) -> None:
    """Every rank's results are bitwise identical (float64 holds every value of the three dtypes exactly, with
    the sign of zero): one all-gather for all checks of a transport."""
    mine = torch.cat([t for _, t in results]).view(torch.int64)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    start = 0
    for where, t in results:
        stop = start + t.numel()
        if not all(torch.equal(g[start:stop], mine[start:stop]) for g in gathered):
            sys.exit(f"{where}: ranks hold different results")
        start = stop


def check_strided_refused(rank, tname, comm) -> None:
    base = torch.ones(8)
    allreduce(base[:4], "torus", comm)  # MPI caches views under (address, 4 elements, float32)
    try:  # a strided view with the same address, length and dtype must not reuse them
        allreduce(base[::2], "torus", comm)
    except ValueError:
        return
    sys.exit(f"rank {rank}: {tname}: a strided tensor was reduced instead of refused")


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    grid = parse_grid(os.environ["GRID"])
    torch.set_num_threads(1)
    if os.environ.get("REGISTER"):
        runpy.run_path(os.environ["REGISTER"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    names = runnable()
    counts, replays = {}, {}
    for tname in os.environ["TRANSPORTS"].split(","):
        comm = build(tname, grid)
        checks, results = 0, []
        for name in names:
            checks += check_uses(rank, tname, name, comm, grid)
            for dtype in DTYPES:
                for n in SIZES:
                    check_one(rank, world, tname, name, comm, dtype, n, replays, results)
                    checks += 1
        same_on_every_rank(results, world)
        check_strided_refused(rank, tname, comm)
        counts[tname] = {"checks": checks + 1, "algorithms": list(names)}
        comm.close()
    dist.destroy_process_group()
    with open(os.environ["CHECK_OUT"] + f".{rank}", "w") as f:
        json.dump(counts, f)


if __name__ == "__main__":
    main()
