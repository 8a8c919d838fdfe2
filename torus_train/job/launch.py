"""The launch plan: (spec, grid, hosts, environment) -> the exact argv and environment (pure; no torch import).

The launchers themselves (local, mpirun, srun) are entries of torus_train.job.launchers, one class of pure
methods each; this module asks the chosen entry at every step and adds what every launcher shares: the
worker command (in its container), launch.env, the rendezvous port and the CPUs this machine may use.

Threads per rank (OMP_NUM_THREADS): the step's CPUs per task (``SLURM_CPUS_PER_TASK``), else the node's CPUs
(PBS ``NCPUS``) divided among its ranks, else this machine's usable CPUs (affinity and cgroup quota, not
``os.cpu_count()``) divided among the ranks when every host is this one, else 4.

Under mpirun and srun the rendezvous travels in the environment, so ranks need no MPI library to find rank 0:
MASTER_ADDR is the first host used (ranks are placed K per node in host order, so rank 0 runs there) and
MASTER_PORT comes from ``rendezvous_port``, a function of the job, outside the ephemeral port range. Singularity
and Apptainer pass the host environment into ``exec`` by default, so containers see the same two variables.

``auto`` picks srun inside a Slurm job, mpirun inside a PBS job (``$PBS_NODEFILE``) or with a hostfile, and
local otherwise (each entry's ``auto``). Reading a hostfile is the only I/O here (``resolve_hosts``);
``build_plan`` is a pure function that the tests check argv for argv.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping

from torus_train.job import gpus
from torus_train.job.gpus import rank_gpus
from torus_train.job.hosts import Host
from torus_train.job.launchers import (
    LAUNCHERS,
    Launcher,
    LaunchError,
    LaunchPlan,
    PlanRequest,
    choose,
    entry,
    launched_by,
    threads_per_rank,
)
from torus_train.job.launchers.rendezvous import DEFAULT_EPHEMERAL, ephemeral_range, job_key, port_band, rendezvous_port
from torus_train.job.sources import source_of
from torus_train.job.spec import JobSpec
from torus_train.job.topology import Grid, check_grid_size, choose_grid, parse_grid

WORKER = ["-m", "torus_train.ranks.worker"]

__all__ = [
    "DEFAULT_EPHEMERAL",
    "LAUNCHERS",
    "LaunchError",
    "LaunchPlan",
    "build_plan",
    "check_capacity",
    "check_devices",
    "choose_launcher",
    "container_binds",
    "container_runtime",
    "cpus_per_rank",
    "ephemeral_range",
    "fit_to_local_gpus",
    "fixed_grid",
    "inside_launched_rank",
    "job_key",
    "launcher_here",
    "plan_here",
    "plan_launch",
    "port_band",
    "rendezvous_port",
    "resolve_grid",
    "resolve_hosts",
    "threads_per_rank",
    "usable_cpus",
]


# --------------------------------------------------------------------------------------------------------
def choose_launcher(requested: str, environ: Mapping[str, str], hostfile: str) -> tuple[str, str]:
    """(launcher name, why) for launch.launcher; 'auto' asks each entry whether the environment is its own."""
    chosen, why = choose(requested, environ, hostfile)
    return chosen.name, why


def inside_launched_rank(environ: Mapping[str, str]) -> bool:
    """True when this process is already one rank of a launcher's job (`mpirun -n 4 torus-train run`)."""
    return launched_by(environ) is not None


def resolve_hosts(launcher: str | Launcher, spec: JobSpec, environ: Mapping[str, str]) -> tuple[list[Host], str]:
    """(hosts, hostfile path) for the launcher; reads the hostfile or PBS node file."""
    return entry(launcher).hosts(spec.launch.hostfile, environ)


def resolve_grid(spec: JobSpec, launcher: str | Launcher, hosts: list[Host], local_gpus: int) -> Grid:
    """World size and grid from the spec, filling what it leaves open from the launcher's hosts (or GPUs)."""
    chosen = entry(launcher)
    n = spec.grid.gpus or (parse_grid(spec.grid.grid).size if spec.grid.grid else 0)
    n = n or chosen.default_world(hosts, local_gpus)
    return _grid(spec, n, spec.grid.gpus_per_node or chosen.default_per_node(n, hosts))


def fit_to_local_gpus(spec: JobSpec, environ: Mapping[str, str], visible_gpus: int) -> bool:
    """The embedded default job on a GPU machine: one rank per GPU here (grid.gpus = the GPUs, the grid chosen
    for them) instead of its 2 CPU ranks, when its ranks start on this machine (no hostfile, no scheduler, not
    already a rank) and comm.backend leaves the GPUs to it. The caller applies this only when the command line
    named no world size or grid. True when the spec changed."""
    gpus = rank_gpus(spec.comm.backend, visible_gpus)
    chosen, _ = choose(spec.launch.launcher, environ, spec.launch.hostfile)
    if not gpus or not chosen.runs_here or inside_launched_rank(environ):
        return False
    spec.grid.gpus, spec.grid.grid = gpus, ""
    return True


def check_devices(spec: JobSpec, chosen: Launcher, local_gpus: int, environ: Mapping[str, str]) -> None:
    """What the ranks' devices cannot give, refused in one line before they start: NCCL ranks here on no GPU
    that CUDA shows (the reason from job/gpus.py: a repeated or invalid CUDA_VISIBLE_DEVICES entry, no
    driver), and data.decoder = gpu on ranks that run on the CPU (gloo, or no GPU here)."""
    if chosen.runs_here and spec.comm.backend == "nccl" and not local_gpus:
        why = local_gpus_why(environ, 0)
        raise LaunchError(
            f"comm.backend = nccl needs one GPU per rank and CUDA shows none here{f' ({why})' if why else ''}; "
            "pass --backend gloo for CPU ranks"
        )
    cpu_ranks = spec.comm.backend == "gloo" or (chosen.runs_here and not local_gpus)
    if cpu_ranks and spec.data.decoder == "gpu" and source_of(spec.data.source).reads_files:
        where = "comm.backend = gloo" if spec.comm.backend == "gloo" else "CUDA shows no GPU here"
        raise LaunchError(
            f"data.decoder = gpu needs ranks on CUDA GPUs, and these ranks run on the CPU ({where}); "
            "use data.decoder = auto or cpu"
        )


def local_gpus_why(environ: Mapping[str, str], count: int) -> str:
    """Why CUDA shows ``count`` GPUs here when that is fewer than asked (job/gpus.py); "" when it shows what
    CUDA_VISIBLE_DEVICES names, or when ``count`` came from elsewhere than this machine's probe."""
    seen = gpus.local_gpus(environ)
    return seen.why if seen.count == count else ""


def fixed_grid(spec: JobSpec) -> Grid:
    """The grid of a spec whose grid.gpus and grid.gpus_per_node are both set: ranks already started by a
    launcher, with no hosts to fill anything in from (`mpirun -n 4 torus-train run`)."""
    if not spec.grid.gpus or not spec.grid.gpus_per_node:
        raise LaunchError("grid.gpus and grid.gpus_per_node must both be set to fix the grid without hosts")
    return _grid(spec, spec.grid.gpus, spec.grid.gpus_per_node)


def _grid(spec: JobSpec, n: int, k: int) -> Grid:
    """grid.grid at k ranks per node (checked against n ranks), else a grid chosen for n."""
    if spec.grid.grid:
        grid = parse_grid(spec.grid.grid, k)
        check_grid_size(grid, n, "--gpus" if spec.grid.gpus else "the world size")
        return grid
    return choose_grid(n, k)[0]


def check_capacity(
    launcher: str | Launcher, grid: Grid, hosts: list[Host], hostfile: str, local_gpus: int, cpu_count: int
) -> None:
    """Refuse a plan whose ranks cannot all get a slot; say how to launch it instead."""
    entry(launcher).check_capacity(grid, hosts, hostfile, local_gpus, cpu_count)


def usable_cpus(cpu_count: int | None = None, cgroup_root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may really use: its affinity mask, capped by a cgroup CPU quota (v2 cpu.max or v1
    cpu.cfs_quota_us / cpu.cfs_period_us); os.cpu_count() counts the whole machine and ignores both."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = cpu_count or os.cpu_count() or 1
    for quota_file, period_file in (
        ("cpu.max", None),
        ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us"),
        ("cpu,cpuacct/cpu.cfs_quota_us", "cpu,cpuacct/cpu.cfs_period_us"),
    ):
        try:
            with open(os.path.join(cgroup_root, quota_file)) as f:
                fields = f.read().split()
            if period_file:
                with open(os.path.join(cgroup_root, period_file)) as f:
                    fields = fields[:1] + f.read().split()[:1]
            quota, period = fields[0], fields[1]
        except (OSError, IndexError):
            continue
        if quota not in ("max", "-1") and int(quota) > 0 and int(period) > 0:
            n = min(n, max(1, int(quota) // int(period)))
        break
    return max(1, n)


def cpus_per_rank(
    launcher: str | Launcher, environ: Mapping[str, str], ranks_on_node: int, cpu_count: int, all_local: bool
) -> tuple[int, str]:
    """(threads per rank, where that number came from); see the module docstring for the order."""
    return entry(launcher).threads(environ, ranks_on_node, cpu_count, all_local)


def _passed_env(spec: JobSpec, environ: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in spec.launch.env:
        name, eq, value = item.partition("=")
        if eq:
            out[name] = value
        elif name in environ:
            out[name] = environ[name]
    return out


def container_binds(spec: JobSpec, job_file: str) -> list[str]:
    """Folders the ranks must see inside the container: the data folder (and its index, where that lies
    elsewhere), the output folder (it holds job.json) and launch.binds. Many sites bind only $HOME and the
    working directory by default, so a data set on /groups or /scratch would be invisible without these."""
    binds: list[str] = []
    if source_of(spec.data.source).takes_path:
        binds.append(spec.data.source)
    if spec.data.index and not spec.data.index.startswith(spec.data.source.rstrip("/") + "/"):
        binds.append(spec.data.index)
    out = os.path.dirname(job_file) or "."
    binds.append(out)
    binds += spec.launch.binds
    seen: list[str] = []
    for b in binds:
        if b not in seen:
            seen.append(b)
    return seen


def container_runtime(requested: str, which: Callable[[str], str | None] = shutil.which) -> str:
    """The container command: as asked, except that `singularity` becomes `apptainer` on a host that has only
    Apptainer (which no longer installs a `singularity` alias everywhere)."""
    if requested == "singularity" and not which("singularity") and which("apptainer"):
        return "apptainer"
    return requested


def _container(spec: JobSpec, job_file: str, runtime: str) -> list[str]:
    if not spec.launch.container:
        return []
    argv = [runtime, "exec", "--nv"]
    for b in container_binds(spec, job_file):
        argv += ["--bind", b]
    return [*argv, spec.launch.container]


def build_plan(
    spec: JobSpec,
    grid: Grid,
    launcher: str | Launcher,
    why: str,
    hosts: list[Host],
    *,
    hostfile: str,
    job_file: str,
    python: str,
    environ: Mapping[str, str],
    as_root: bool = False,
    master_port: int = 29500,
    cpu_count: int = 1,
    local_gpus: int = 0,
    ephemeral: tuple[int, int] = DEFAULT_EPHEMERAL,
    runtime: str = "",
) -> LaunchPlan:
    """The exact command(s) and environment for the chosen launcher (pure).

    master_port: the port of a launcher whose ranks run here (a free one on this machine); the others use
    rendezvous_port(job_key(environ, job_file), ephemeral) instead, since rank 0 runs on another host.
    runtime: the container command (container_runtime()); empty = launch.container_runtime as written."""
    chosen = entry(launcher)
    python = spec.launch.python or ("python3" if spec.launch.container else python)
    worker = [*_container(spec, job_file, runtime or spec.launch.container_runtime), python, *WORKER, "--job", job_file]
    port = master_port if chosen.runs_here else rendezvous_port(job_key(environ, job_file), ephemeral)
    return chosen.build(
        PlanRequest(
            grid,
            why,
            hosts,
            hostfile,
            worker,
            _passed_env(spec, environ),
            list(spec.launch.launcher_args),
            environ,
            port,
            as_root,
            cpu_count,
            local_gpus,
            spec.comm.backend,
            spec.launch.cpus_per_rank,
        )
    )


def launcher_here(mpi_world: bool = False) -> Launcher:
    """The first launcher in the table that starts ranks on this machine by itself, or with mpi_world the first
    whose ranks form one MPI world (the MPI transport needs MPI_COMM_WORLD)."""
    return next(e for e in LAUNCHERS if (e.mpi_world if mpi_world else e.runs_here))


def plan_here(
    launcher: str | Launcher,
    grid: Grid,
    command: list[str],
    *,
    environ: Mapping[str, str],
    port: int,
    as_root: bool,
    cpu_count: int,
    local_gpus: int = 0,
    why: str = "",
) -> LaunchPlan:
    """`command` started as the ranks of `grid`, all on this machine, by the launcher (bench: its own command
    line as N ranks). The launcher's capacity rules are the caller's to apply."""
    here = Grid(grid.x, grid.y, grid.size)  # one node holds every rank
    return entry(launcher).build(
        PlanRequest(
            here,
            why,
            [Host("localhost", grid.size)],
            "",
            command,
            {},
            [],
            environ,
            port,
            as_root,
            cpu_count,
            local_gpus,
        )
    )


def plan_launch(
    spec: JobSpec,
    environ: Mapping[str, str],
    *,
    job_file: str,
    python: str,
    as_root: bool,
    master_port: int,
    cpu_count: int,
    local_gpus: int,
    strict: bool = True,
) -> LaunchPlan:
    """Choose the launcher, read the hosts, fix the grid, check capacity and build the plan.

    strict=False (--dry-run) builds a plan that cannot start here anyway and says why in its notes."""
    chosen, why = choose(spec.launch.launcher, environ, spec.launch.hostfile)
    hosts, hostfile = chosen.hosts(spec.launch.hostfile, environ)
    grid = resolve_grid(spec, chosen, hosts, local_gpus)
    try:
        check_devices(spec, chosen, local_gpus, environ)
        chosen.check_gpus(grid, environ, spec.comm.backend)
        try:
            chosen.check_capacity(grid, hosts, hostfile, local_gpus, cpu_count)
        except LaunchError as e:
            why = local_gpus_why(environ, local_gpus) if chosen.runs_here and local_gpus else ""
            raise LaunchError(f"CUDA shows {local_gpus} GPU(s) here ({why}): {e}" if why else str(e)) from None
        problem = ""
    except LaunchError as e:
        if strict:
            raise
        problem = f"cannot start here: {e}"
    plan = build_plan(
        spec,
        grid,
        chosen,
        why,
        hosts,
        hostfile=hostfile,
        job_file=job_file,
        python=python,
        environ=environ,
        as_root=as_root,
        master_port=master_port,
        cpu_count=min(cpu_count, usable_cpus(cpu_count)),
        local_gpus=local_gpus,
        ephemeral=ephemeral_range(),
        runtime=container_runtime(spec.launch.container_runtime),
    )
    if problem:
        plan.notes.append(problem.replace(", or add --dry-run to only print the plan", ""))
    return plan
