"""The launch plan: (spec, grid, hosts, environment) -> the exact argv and environment (pure; no torch import).

Three launchers:

- ``local``: N worker processes on this machine, each with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR /
  MASTER_PORT (the run command spawns and supervises them);
- ``mpirun``: one OpenMPI command, ``-np N --map-by ppr:K:node --hostfile F -x PATH -x LD_LIBRARY_PATH -x VAR=...
  -x MASTER_ADDR=host -x MASTER_PORT=port [singularity exec --nv --bind DATA --bind OUT IMAGE] python -m
  torus_train.ranks.worker --job OUT/job.json``; with the CPUs per node known (PBS ``NCPUS``) each rank is bound
  to its share of cores (``ppr:K:node:PE=C --bind-to core``);
- ``srun``: one Slurm step, ``--nodes --ntasks --ntasks-per-node [--cpus-per-task=C --cpu-bind=cores]
  --kill-on-bad-exit=1 --export=ALL``, with the variables for the ranks in srun's own environment: srun splits
  ``--export`` on commas, so a value such as ``NCCL_IB_HCA=mlx5_0,mlx5_1`` cannot travel inside it. Since Slurm
  22.05 a step does not inherit ``--cpus-per-task`` from the batch job, so it is passed on explicitly.

Threads per rank (OMP_NUM_THREADS): the step's CPUs per task (``SLURM_CPUS_PER_TASK``), else the node's CPUs
(PBS ``NCPUS``) divided among its ranks, else this machine's usable CPUs (affinity and cgroup quota, not
``os.cpu_count()``) divided among the ranks when every host is this one, else 4.

Under mpirun and srun the rendezvous travels in the environment, so ranks need no MPI library to find rank 0:
MASTER_ADDR is the first host used (ranks are placed K per node in host order, so rank 0 runs there) and
MASTER_PORT comes from ``rendezvous_port``, a function of the job, outside the ephemeral port range. Singularity
and Apptainer pass the host environment into ``exec`` by default, so containers see the same two variables.

``auto`` picks srun inside a Slurm job, mpirun inside a PBS job (``$PBS_NODEFILE``) or with a hostfile, and
local otherwise. Reading a hostfile is the only I/O here (``resolve_hosts``); ``build_plan`` is a pure function
that the tests check argv for argv.
"""
from __future__ import annotations

import hashlib
import math
import os
import shlex
import shutil
from dataclasses import dataclass, field
from typing import Mapping

from torus_train.errors import UserError
from torus_train.job.hosts import Host, HostsError, read_hostfile, slurm_hosts, total_slots
from torus_train.job.spec import JobSpec
from torus_train.job.sources import source_of
from torus_train.job.topology import Grid, check_grid_size, choose_grid, parse_grid

WORKER = ["-m", "torus_train.ranks.worker"]
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
MAX_LOCAL_CPU_RANKS = 8
PORT_BAND = (20000, 32767)
"""Where rendezvous ports are drawn from: below Linux's default ephemeral range (32768-60999)."""
DEFAULT_EPHEMERAL = (32768, 60999)
EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


class LaunchError(UserError):
    """A launch that cannot work as asked (too few slots, no way to reach that many GPUs)."""


@dataclass
class LaunchPlan:
    """Everything needed to start the ranks; printed by --dry-run and executed by `run`."""

    launcher: str
    """local | mpirun | srun."""
    why: str
    """How the launcher was chosen."""
    grid: Grid
    """The grid the ranks form."""
    hosts: list[Host]
    """Nodes used (one 'localhost' entry for the local launcher)."""
    argv: list[str]
    """mpirun/srun: the one command; local: the worker command every rank runs."""
    env: dict[str, str] = field(default_factory=dict)
    """Added to the environment of the command (local: of every rank)."""
    rank_env: list[dict[str, str]] = field(default_factory=list)
    """local only: the per-rank variables (RANK, LOCAL_RANK, ...)."""
    hostfile: str = ""
    """The hostfile or node file the plan reads, if any."""
    notes: list[str] = field(default_factory=list)
    """Things the user should know (said once)."""

    @property
    def world_size(self) -> int:
        return self.grid.size

    def command_text(self) -> str:
        """The exact command as a shell line (local: the first rank's, with its variables)."""
        if self.launcher == "local":
            first = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**self.rank_env[0], **self.env}.items())
            return (f"{first} {shlex.join(self.argv)}\n  (x{self.world_size} ranks, RANK/LOCAL_RANK 0.."
                    f"{self.world_size - 1})")
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items())
        return prefix + shlex.join(self.argv)


# --------------------------------------------------------------------------------------------------------
def choose_launcher(requested: str, environ: Mapping[str, str], hostfile: str) -> tuple[str, str]:
    """(launcher, why) for launch.launcher; 'auto' looks at the scheduler environment and the hostfile."""
    if requested != "auto":
        return requested, f"launch.launcher = {requested}"
    if environ.get("SLURM_JOB_ID"):
        return "srun", f"auto: inside Slurm job {environ['SLURM_JOB_ID']}"
    if environ.get("PBS_NODEFILE"):
        return "mpirun", f"auto: inside a PBS job (PBS_NODEFILE={environ['PBS_NODEFILE']})"
    if hostfile:
        return "mpirun", "auto: a hostfile was given"
    return "local", "auto: no hostfile and no scheduler, so ranks start on this machine"


def inside_launched_rank(environ: Mapping[str, str]) -> bool:
    """True when this process is already one rank of an mpirun/srun/torchrun job (`mpirun -n 4 torus-train run`)."""
    if "OMPI_COMM_WORLD_SIZE" in environ or "PMI_SIZE" in environ or "PMIX_RANK" in environ:
        return True
    if "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        return True
    return "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ)


def resolve_hosts(launcher: str, spec: JobSpec, environ: Mapping[str, str]) -> tuple[list[Host], str]:
    """(hosts, hostfile path) for the launcher; reads the hostfile or PBS node file."""
    if launcher == "local":
        return [Host("localhost", 0)], ""
    if launcher == "srun":
        if spec.launch.hostfile:
            return read_hostfile(spec.launch.hostfile, "--hostfile"), spec.launch.hostfile
        if not environ.get("SLURM_JOB_ID"):
            raise LaunchError("launcher srun needs a Slurm allocation: submit with sbatch (see scripts/slurm/) or "
                              "run inside salloc")
        return slurm_hosts(environ), ""
    path = spec.launch.hostfile or environ.get("PBS_NODEFILE", "")
    if not path:
        raise LaunchError("launcher mpirun needs a hostfile: pass --hostfile FILE ('host slots=K' per line) or run "
                          "inside a PBS job (PBS_NODEFILE)")
    what = "--hostfile" if spec.launch.hostfile else "PBS_NODEFILE"
    return read_hostfile(path, what), path


def resolve_grid(spec: JobSpec, launcher: str, hosts: list[Host], local_gpus: int) -> Grid:
    """World size and grid from the spec, filling what it leaves open from the hosts (or local GPUs)."""
    want = parse_grid(spec.grid.grid) if spec.grid.grid else None
    n = spec.grid.gpus or (want.size if want else 0)
    if not n:
        n = total_slots(hosts) if launcher != "local" else max(local_gpus, 1)
    k = spec.grid.gpus_per_node
    if not k:
        k = n if launcher == "local" else hosts[0].slots
    if want is not None:
        grid = Grid(want.x, want.y, k)
        check_grid_size(grid, n, "--gpus" if spec.grid.gpus else "the world size")
        return grid
    return choose_grid(n, k)[0]


def check_capacity(launcher: str, grid: Grid, hosts: list[Host], hostfile: str, local_gpus: int,
                   cpu_count: int) -> None:
    """Refuse a plan whose ranks cannot all get a slot; say how to launch it instead."""
    n = grid.size
    if launcher == "local":
        limit = local_gpus if local_gpus else max(MAX_LOCAL_CPU_RANKS, cpu_count)
        if n > limit:
            kind = f"{local_gpus} GPUs" if local_gpus else f"no GPU (CPU ranks: at most {limit})"
            raise LaunchError(
                f"{n} ranks do not fit on this machine ({kind}); to launch grid {grid} pass --hostfile FILE "
                f"('host slots=K' per node, e.g. K=4 for {math.ceil(n / 4)} nodes; mpirun), submit from inside a "
                f"Slurm or PBS job (scripts/slurm/, scripts/pbs/), or add --dry-run to only print the plan")
        return
    have = total_slots(hosts)
    where = hostfile or "the Slurm allocation"
    if have < n:
        raise HostsError(f"{where} offers {have} slots on {len(hosts)} hosts but the job needs {n} ranks "
                         f"(grid {grid}); add hosts or lower --gpus")
    small = [h for h in hosts[: grid.nodes] if h.slots < grid.gpus_per_node]
    if small:
        raise HostsError(f"{where}: host {small[0].name} offers {small[0].slots} slots but gpus_per_node is "
                         f"{grid.gpus_per_node}; ranks are placed {grid.gpus_per_node} per node")


def threads_per_rank(ranks_on_node: int, cpu_count: int) -> int:
    """CPU threads per rank so that the ranks of one node share its cores: max(1, cores // ranks)."""
    return max(1, cpu_count // max(1, ranks_on_node))


def usable_cpus(cpu_count: int | None = None, cgroup_root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may really use: its affinity mask, capped by a cgroup CPU quota (v2 cpu.max or v1
    cpu.cfs_quota_us / cpu.cfs_period_us); os.cpu_count() counts the whole machine and ignores both."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = cpu_count or os.cpu_count() or 1
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us"),
                                    ("cpu,cpuacct/cpu.cfs_quota_us", "cpu,cpuacct/cpu.cfs_period_us")):
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


def cpus_per_rank(launcher: str, environ: Mapping[str, str], ranks_on_node: int, cpu_count: int,
                  all_local: bool) -> tuple[int, str]:
    """(threads per rank, where that number came from); see the module docstring for the order."""
    per_task = environ.get("SLURM_CPUS_PER_TASK", "")
    if launcher == "srun" and per_task.isdigit() and int(per_task) > 0:
        return int(per_task), "SLURM_CPUS_PER_TASK"
    ncpus = environ.get("NCPUS", "")
    if launcher == "mpirun" and environ.get("PBS_JOBID") and ncpus.isdigit() and int(ncpus) > 0:
        return threads_per_rank(ranks_on_node, int(ncpus)), "NCPUS"
    if all_local:
        return threads_per_rank(ranks_on_node, cpu_count), "usable CPUs"
    return 4, "default"


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


def container_runtime(requested: str, which=shutil.which) -> str:
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
    return argv + [spec.launch.container]


def ephemeral_range(path: str = EPHEMERAL_FILE) -> tuple[int, int]:
    """This host's ephemeral (outgoing) port range, or Linux's default when the file cannot be read."""
    try:
        with open(path) as f:
            lo, hi = (int(v) for v in f.read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def port_band(ephemeral: tuple[int, int] = DEFAULT_EPHEMERAL) -> tuple[int, int]:
    """The ports rendezvous_port draws from: PORT_BAND minus the ephemeral range, else the wider free side of
    the ephemeral range (above 1023), else PORT_BAND when the ephemeral range covers every port."""
    lo, hi = PORT_BAND
    elo, ehi = ephemeral
    pieces = [(lo, min(hi, elo - 1)), (max(lo, ehi + 1), hi)]
    pieces = [(a, b) for a, b in pieces if a <= b]
    if not pieces:
        pieces = [(a, b) for a, b in ((1024, elo - 1), (ehi + 1, 65535)) if a <= b]
    return max(pieces, key=lambda p: p[1] - p[0]) if pieces else PORT_BAND


def rendezvous_port(key: str, ephemeral: tuple[int, int] = DEFAULT_EPHEMERAL) -> int:
    """The rendezvous port of a job: every process that knows `key` computes the same one, in port_band().

    A key of digits (a Slurm job id) maps to lo + id mod width, so consecutive jobs get consecutive ports;
    any other key (the job file path) through sha256, which, unlike hash(), is the same in every process."""
    lo, hi = port_band(ephemeral)
    n = int(key) if key.isdigit() else int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    return lo + n % (hi - lo + 1)


def job_key(environ: Mapping[str, str], job_file: str) -> str:
    """What names this launch: the scheduler's job id (if any) and the job file, which lives in the run's own
    output folder, so two runs inside one allocation get different ports."""
    job = environ.get("SLURM_JOB_ID") or environ.get("PBS_JOBID") or ""
    return f"{job}:{job_file}"


def rendezvous_env(hosts: list[Host], port: int) -> dict[str, str]:
    """MASTER_ADDR/MASTER_PORT for every rank: the first host (rank 0 runs there) and the job's port."""
    return {"MASTER_ADDR": hosts[0].name, "MASTER_PORT": str(port)}


def build_plan(spec: JobSpec, grid: Grid, launcher: str, why: str, hosts: list[Host], *, hostfile: str,
               job_file: str, python: str, environ: Mapping[str, str], as_root: bool = False,
               master_port: int = 29500, cpu_count: int = 1, local_gpus: int = 0,
               ephemeral: tuple[int, int] = DEFAULT_EPHEMERAL, runtime: str = "") -> LaunchPlan:
    """The exact command(s) and environment for the chosen launcher (pure).

    master_port: the local launcher's port (a free one on this machine); mpirun and srun use
    rendezvous_port(job_key(environ, job_file), ephemeral) instead, since rank 0 runs on another host.
    runtime: the container command (container_runtime()); empty = launch.container_runtime as written."""
    n, k = grid.size, grid.gpus_per_node
    python = spec.launch.python or ("python3" if spec.launch.container else python)
    worker = [*_container(spec, job_file, runtime or spec.launch.container_runtime), python, *WORKER, "--job",
              job_file]
    passed = _passed_env(spec, environ)
    notes: list[str] = []

    if launcher == "local":
        threads = threads_per_rank(n, cpu_count)
        if not local_gpus:
            notes.append(f"no GPU here: {n} CPU ranks on gloo, {threads} thread(s) each")
        env = {"OMP_NUM_THREADS": str(threads), **passed}
        rank_env = [{"RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(n),
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)} for r in range(n)]
        return LaunchPlan("local", why, grid, [Host("localhost", n)], worker, env, rank_env, "", notes)

    used = hosts[: grid.nodes]
    threads, source = cpus_per_rank(launcher, environ, k, cpu_count, all(h.name in LOCAL_NAMES for h in used))
    env = {"OMP_NUM_THREADS": str(threads), **passed}
    rdv = rendezvous_env(used, rendezvous_port(job_key(environ, job_file), ephemeral))
    rdv = {k: v for k, v in rdv.items() if k not in passed}  # launch.env may name rank 0's host on another network
    if launcher == "mpirun":
        argv = ["mpirun"] + (["--allow-run-as-root"] if as_root else [])
        if source == "NCPUS":  # the node's cores are known: each rank gets its own share
            argv += ["-np", str(n), "--map-by", f"ppr:{k}:node:PE={threads}", "--bind-to", "core"]
        else:
            argv += ["-np", str(n), "--map-by", f"ppr:{k}:node", "--bind-to", "none"]
        argv += ["--hostfile", hostfile]
        # the ranks on other nodes start from the remote shell's environment: carry this one's PATH (the
        # activated environment) and LD_LIBRARY_PATH (modules) with them
        for name in ("PATH", "LD_LIBRARY_PATH"):
            if name in environ and name not in env:
                argv += ["-x", name]
        for name, value in {**env, **rdv}.items():
            argv += ["-x", f"{name}={value}"]
        argv += [*spec.launch.launcher_args, *worker]
        return LaunchPlan("mpirun", why, grid, used, argv, {}, [], hostfile, notes)

    if launcher == "srun":
        argv = ["srun", f"--nodes={grid.nodes}", f"--ntasks={n}", f"--ntasks-per-node={k}"]
        if source == "SLURM_CPUS_PER_TASK":  # a step does not inherit it from the job (Slurm >= 22.05)
            argv += [f"--cpus-per-task={threads}", "--cpu-bind=cores"]
        # the ranks' variables go in srun's environment and --export=ALL carries them: srun splits --export
        # on commas, so NCCL_IB_HCA=mlx5_0,mlx5_1 inside it would lose everything after the first HCA
        argv += ["--kill-on-bad-exit=1", "--export=ALL"]
        if hostfile:
            argv.append(f"--nodelist={','.join(h.name for h in used)}")
        argv += [*spec.launch.launcher_args, *worker]
        return LaunchPlan("srun", why, grid, used, argv, {**env, **rdv}, [], hostfile, notes)

    raise LaunchError(f"launch.launcher: {launcher!r} is not one of local, mpirun, srun, auto")


def plan_launch(spec: JobSpec, environ: Mapping[str, str], *, job_file: str, python: str, as_root: bool,
                master_port: int, cpu_count: int, local_gpus: int, strict: bool = True) -> LaunchPlan:
    """Choose the launcher, read the hosts, fix the grid, check capacity and build the plan.

    strict=False (--dry-run) builds a local plan that cannot start here anyway and says why in its notes."""
    launcher, why = choose_launcher(spec.launch.launcher, environ, spec.launch.hostfile)
    hosts, hostfile = resolve_hosts(launcher, spec, environ)
    grid = resolve_grid(spec, launcher, hosts, local_gpus)
    try:
        check_capacity(launcher, grid, hosts, hostfile, local_gpus, cpu_count)
        problem = ""
    except LaunchError as e:
        if strict:
            raise
        problem = f"cannot start here: {e}"
    plan = build_plan(spec, grid, launcher, why, hosts, hostfile=hostfile, job_file=job_file, python=python,
                      environ=environ, as_root=as_root, master_port=master_port,
                      cpu_count=min(cpu_count, usable_cpus(cpu_count)), local_gpus=local_gpus,
                      ephemeral=ephemeral_range(), runtime=container_runtime(spec.launch.container_runtime))
    if problem:
        plan.notes.append(problem.replace(", or add --dry-run to only print the plan", ""))
    return plan
