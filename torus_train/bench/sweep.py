"""The all-reduce sweep inside a rank (imports torch): the expected values, the timed rounds, the rows every
rank agrees on, and the rank's whole side of `bench allreduce` (its transport up, the sweep, down). The pure
part (sizes, rows, tables, nccl-tests' conventions) is torus_train.bench.allreduce."""

from __future__ import annotations

import os
import time

import torch

from torus_train.bench.allreduce import EPS, ITEMSIZE, ROUNDS, BenchConfig, Row, make_row
from torus_train.comm.algos import allreduce
from torus_train.comm.mpi.transport import MpiGrid
from torus_train.job.launchers.base import MAX_CPUS
from torus_train.job.topology import Grid
from torus_train.ranks.distributed import init_distributed, shutdown
from torus_train.usernumbers import env_int


def measure(cfg: BenchConfig, grid: Grid, backend: str, timeout: float, on_ready, progress) -> list[Row]:
    """This rank's part of a sweep: its transport on ``grid`` (the MPI world, or torch.distributed groups made
    as a training rank makes them), on_ready(transport notes) once it is up, the sweep, the transport closed."""
    torch.set_num_threads(env_int(os.environ, "OMP_NUM_THREADS", 1, MAX_CPUS) or 1)
    if backend == "mpi":
        comm = MpiGrid(grid)  # a dead MPI rank ends the job through mpirun
        finish = lambda: None  # noqa: E731
    else:
        comm, finish = init_distributed(grid, timeout, backend=backend).groups, shutdown
    try:
        on_ready(comm)
        return run_sweep(cfg, comm, progress)
    finally:
        comm.close()
        finish()


# --- the expected values ---------------------------------------------------------------------------
def pattern(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s input: a cheap hash of (rank, index) in [-0.5, 0.5), rounded to `dtype`."""
    i = torch.arange(count, dtype=torch.int64)
    h = (i * 2654435761 + (rank + 1) * 40503 + (i * (rank + 7)) % 9973) % 65536
    return (h.to(torch.float64) / 65536.0 - 0.5).to(dtype)


def count_wrong(result: torch.Tensor, world: int, dtype_name: str) -> int:
    """Elements of `result` farther than the tolerance from the float64 sum of every rank's pattern."""
    count = result.numel()
    ref = torch.zeros(count, dtype=torch.float64)
    for r in range(world):
        ref += pattern(r, count, result.dtype).to(torch.float64)
    # Each of the world-1 additions may round once, plus the final rounding; values are at most 0.5 in size.
    tol = EPS[dtype_name] * 0.5 * world * (world + 1) + 1e-12
    return int(((result.to(torch.float64) - ref).abs() > tol).sum())


# --- the sweep, inside a rank -----------------------------------------------------------------------
def run_sweep(cfg: BenchConfig, comm, progress=None) -> list[Row]:
    """Measure every size and algorithm (interleaved) on `comm`; every rank returns the same rows."""
    device = torch.device("cuda", torch.cuda.current_device()) if comm.backend == "nccl" else torch.device("cpu")
    flag = torch.zeros(1, dtype=torch.float64, device=device)
    rows: list[Row] = []
    for size in cfg.sizes():
        mine = pattern(comm.rank, size // ITEMSIZE[cfg.dtype], getattr(torch, cfg.dtype)).to(device)
        buf = mine.clone()
        wrong, iters = _check_and_warm(cfg, comm, mine, buf, flag)
        spent = _timed_rounds(cfg, comm, buf, iters, flag)
        for algo in cfg.algos:
            row = _agreed_row(cfg, comm, algo, size, spent[algo] / iters[algo], wrong[algo], flag)
            rows.append(row)
            if progress is not None and comm.rank == 0:
                progress(row)
    return rows


def _check_and_warm(cfg, comm, mine, buf, flag) -> tuple[dict, dict]:
    """Per algorithm: the #wrong elements of one checked all-reduce (-c), the warm-up, and the iterations
    this point will time."""
    wrong, iters = {}, {}
    for algo in cfg.algos:
        wrong[algo] = 0
        if cfg.check:
            buf.copy_(mine)
            allreduce(buf, algo, comm)
            wrong[algo] = count_wrong(buf.cpu(), comm.grid.size, cfg.dtype)
        for _ in range(cfg.warmup):
            allreduce(buf, algo, comm)
        iters[algo] = _iterations(cfg, buf, algo, comm, flag)
    return wrong, iters


def _timed_rounds(cfg, comm, buf, iters: dict, flag) -> dict:
    """Seconds each algorithm spent on its iterations. They run in rounds that alternate the algorithms, so a
    change in the machine's load during the point falls on all of them alike."""
    rounds = min(ROUNDS, min(iters.values()))
    spent = dict.fromkeys(cfg.algos, 0.0)
    for r in range(rounds):
        for algo in cfg.algos:
            share = iters[algo] // rounds + (1 if r < iters[algo] % rounds else 0)
            _barrier(comm, flag)
            t0 = time.perf_counter()
            for _ in range(share):
                allreduce(buf, algo, comm)
            _sync(buf)
            spent[algo] += time.perf_counter() - t0
    return spent


def _agreed_row(cfg, comm, algo: str, size: int, seconds: float, wrong: int, like) -> Row:
    """The row every rank reports: the slowest rank's time, the #wrong summed over the ranks."""
    timing = like.new_tensor([seconds])
    comm.world_max(comm.buffer(timing))
    stats = like.new_tensor([float(wrong)])
    comm.world_allreduce(comm.buffer(stats))
    return make_row(
        algo,
        comm.backend,
        f"{comm.grid.x}x{comm.grid.y}",
        comm.grid.size,
        size,
        cfg.dtype,
        float(timing[0]),
        int(stats[0]),
    )


def _iterations(cfg, buf, algo, comm, flag) -> int:
    """-n, reduced for big messages so one point takes at most about max_seconds_per_point."""
    if cfg.iters <= 3:
        return cfg.iters
    t0 = time.perf_counter()
    allreduce(buf, algo, comm)
    _sync(buf)
    flag[0] = time.perf_counter() - t0
    comm.world_max(comm.buffer(flag))
    once = float(flag[0])
    return max(3, min(cfg.iters, int(cfg.max_seconds_per_point / max(once, 1e-9))))


def _sync(buf) -> None:
    if buf.is_cuda:
        torch.cuda.synchronize(buf.device)


def _barrier(comm, flag) -> None:
    flag[0] = 0.0
    comm.world_max(comm.buffer(flag))
