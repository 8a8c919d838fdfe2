"""`mpirun` (OpenMPI): one command starts every rank over a hostfile (no torch import).

``mpirun -np N --map-by ppr:K:node[:PE=C] --bind-to core|none --hostfile F -x PATH -x LD_LIBRARY_PATH
-x VAR=... -x MASTER_ADDR=host -x MASTER_PORT=port [launch.launcher_args] COMMAND``. Hosts given without a file
(ranks on this machine, as `bench --backend mpi` starts them) need no host option, with ``--oversubscribe``
when the ranks outnumber the CPUs.

Binding (OpenMPI 5, whose mapper is PRRTE's; checked with ``--do-not-launch --display map`` on synthetic
two-socket topologies, ``HWLOC_SYNTHETIC="pack:2 numa:1 core:10 pu:1"``):

- GPUs: mpirun has no GPU binding. Every rank sees its node's GPUs and takes GPU
  ``OMPI_COMM_WORLD_LOCAL_RANK`` (ranks/distributed.py), as Horovod's and MLPerf's launch scripts do; a rank
  whose local rank has no GPU of its own stops before the process group.
- CPUs, where the number per rank C is known (launch.cpus_per_rank, else PBS's ``NCPUS`` shared among a
  node's ranks): ``--map-by ppr:K:node:PE=C --bind-to core`` gives local rank i the i-th block of C cores,
  so ranks 0, 1, ... fill the first socket before the next and rank i sits on the socket of GPU i where GPUs
  are numbered socket by socket. Without C the ranks are not bound (``--bind-to none``): PRRTE binds to "the
  first available object within the object where the process was mapped", so ``ppr:K:node`` with
  ``--bind-to numa`` or ``package`` puts all K ranks on the first NUMA domain, ``ppr:K:numa`` starts K per
  domain (more ranks than GPUs), and ``--map-by numa`` alternates the domains in local-rank order
  (local rank 1 on the second socket, beside GPU 2). PE counts cores: where NCPUS counts hardware threads
  (80 on 40 cores) mpirun refuses the map ("more processes than the ppr for this topology can support");
  set launch.cpus_per_rank to a node's cores over its ranks.

PBS is not a launcher of its own: a PBS job starts its ranks with this same mpirun; it only supplies the host
list (``$PBS_NODEFILE``, one line per slot), the job id and the cores per node (``NCPUS``), which this entry
reads. A PBS entry would build the identical command under a second name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torus_train.job.hosts import Host, read_hostfile
from torus_train.job.launchers.base import (
    MAX_CPUS,
    Launcher,
    LaunchError,
    LaunchPlan,
    PlanRequest,
    RankVars,
    killed_by,
    threads_per_rank,
)
from torus_train.registry import load
from torus_train.usernumbers import env_int

OPENMPI = RankVars(
    "openmpi",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
PMI = RankVars("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
"""MPICH and Intel MPI's mpiexec; srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE too, so Slurm's own variables are
read before these (they carry the local rank, which PMI under srun does not)."""

# OpenMPI/PRRTE: "mpirun noticed that process rank 3 with PID 123 on node node2 exited on signal 9 (Killed)."
KILLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on\s+signal (\d+)")


class Mpirun(Launcher):
    name = "mpirun"
    program = "mpirun"
    mpi_world = True
    auto_priority = 20  # after a Slurm allocation, before this machine
    rank_vars = (OPENMPI,)
    shared_rank_vars = (PMI,)

    def auto(self, environ: Mapping[str, str], hostfile: str) -> str:
        if environ.get("PBS_NODEFILE"):
            return f"auto: inside a PBS job (PBS_NODEFILE={environ['PBS_NODEFILE']})"
        return "auto: a hostfile was given" if hostfile else ""

    def is_rank(self, environ: Mapping[str, str]) -> bool:
        return "OMPI_COMM_WORLD_SIZE" in environ or "PMI_SIZE" in environ or "PMIX_RANK" in environ

    def rendezvous_by_hand(self, environ: Mapping[str, str]) -> tuple[str, int] | None:
        # rank 0 broadcasts its host and a free port over MPI: mpi4py lives with the ranks, a floor up
        return load("torus_train.ranks.bootstrap:mpi_rendezvous")(environ)

    def culprit(self, lines: list[str]) -> tuple[int, str, str] | None:
        m = KILLED.search(" ".join(lines))  # mpirun breaks this message over two lines
        return (int(m.group(1)), m.group(2), killed_by(int(m.group(3)))) if m else None

    def hosts(self, hostfile: str, environ: Mapping[str, str]) -> tuple[list[Host], str]:
        path = hostfile or environ.get("PBS_NODEFILE", "")
        if not path:
            raise LaunchError(
                "launcher mpirun needs a hostfile: pass --hostfile FILE ('host slots=K' per line) or "
                "run inside a PBS job (PBS_NODEFILE)"
            )
        return read_hostfile(path, "--hostfile" if hostfile else "PBS_NODEFILE"), path

    def scheduler_cpus(self, environ: Mapping[str, str], ranks_on_node: int) -> tuple[int, str] | None:
        """PBS: the cores of each node (``NCPUS``) shared among its ranks."""
        ncpus = env_int(environ, "NCPUS", 0, MAX_CPUS) if environ.get("PBS_JOBID") else None
        if not ncpus:  # unset or 0: nothing said
            return None
        return threads_per_rank(ranks_on_node, ncpus), f"NCPUS={ncpus} over {ranks_on_node} ranks"

    @staticmethod
    def _where(req: PlanRequest) -> list[str]:
        """The hosts: the hostfile; else this machine, where mpirun counts its cores as slots: more ranks than
        CPUs must be allowed (--oversubscribe), and then OpenMPI has idle ranks yield instead of spinning;
        else the hosts by name."""
        if req.hostfile:
            return ["--hostfile", req.hostfile]
        if req.all_local():
            return ["--oversubscribe"] if req.grid.size > req.cpu_count else []
        return ["--host", ",".join(f"{h.name}:{h.slots}" for h in req.used)]

    def build(self, req: PlanRequest) -> LaunchPlan:
        n, k = req.grid.size, req.grid.gpus_per_node
        cpus = self.rank_cpus(req)
        threads = cpus[0] if cpus else self.threads(req.environ, k, req.cpu_count, req.all_local())[0]
        env = {"OMP_NUM_THREADS": str(threads), **req.env}
        argv = [self.program] + (["--allow-run-as-root"] if req.as_root else [])
        argv += ["-np", str(n), *core_binding(k, cpus[0] if cpus else 0)]
        argv += self._where(req)
        # the ranks on other nodes start from the remote shell's environment: carry this one's PATH (the
        # activated environment) and LD_LIBRARY_PATH (modules) with them
        for name in ("PATH", "LD_LIBRARY_PATH"):
            if name in req.environ and name not in env:
                argv += ["-x", name]
        for name, value in {**env, **req.rendezvous()}.items():
            argv += ["-x", f"{name}={value}"]
        notes = ([] if req.backend == "gloo" else [GPU_NOTE]) + [cpu_note(k, cpus)]
        return self.plan(req, [*argv, *req.launcher_args, *req.command], {}, notes=notes)


GPU_NOTE = (
    "GPUs: each rank takes GPU OMPI_COMM_WORLD_LOCAL_RANK of those its node shows (mpirun binds no GPU; a rank "
    "without a GPU of its own stops at start-up)"
)


def core_binding(ranks_on_node: int, cpus: int) -> list[str]:
    """K ranks per node, each bound to its own block of ``cpus`` cores in local-rank order (one socket filled
    before the next); ``cpus`` = 0: not bound (the module docstring says why)."""
    if not cpus:
        return ["--map-by", f"ppr:{ranks_on_node}:node", "--bind-to", "none"]
    return ["--map-by", f"ppr:{ranks_on_node}:node:PE={cpus}", "--bind-to", "core"]


def cpu_note(ranks_on_node: int, cpus: tuple[int, str] | None) -> str:
    """What the plan's CPU binding is, in one line."""
    if cpus is None:
        return (
            "cores: not bound: nothing says how many CPUs a node has (PBS's NCPUS), and binding without that "
            "puts a node's ranks on its first NUMA domain; set launch.cpus_per_rank (a node's cores / its ranks)"
        )
    return (
        f"cores: {cpus[0]} core{'s' if cpus[0] > 1 else ''} per rank ({cpus[1]}), a node's ranks filling its first "
        f"socket first, beside GPUs 0, 1, ... ({' '.join(core_binding(ranks_on_node, cpus[0]))})"
    )
