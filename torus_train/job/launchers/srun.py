"""`srun` (Slurm): one job step starts every rank inside the allocation (no torch import).

``srun --nodes --ntasks --ntasks-per-node=K [--gpus-per-node=K] [--cpus-per-task=C --cpu-bind=cores
--distribution=block:block] --kill-on-bad-exit=1 --export=ALL [--nodelist] [launch.launcher_args] COMMAND``,
with the variables for the ranks in srun's own environment: srun splits ``--export`` on commas, so a value
such as ``NCCL_IB_HCA=mlx5_0,mlx5_1`` cannot travel inside it.

Binding, as Slurm 22.05 does it (srun(1), its source where the page is silent, and a Slurm 22.05.8 node with
two fake GPUs, gres.conf ``File=/dev/tty2[0-1]``):

- GPUs, for ranks that take one (comm.backend = nccl, or auto in an allocation that has GPUs):
  ``--gpus-per-node=K`` gives the step one GPU per rank on every node, also where the job got its GPUs
  implicitly (a step is not given those); every rank of a node sees the K GPUs (``CUDA_VISIBLE_DEVICES=0,1``)
  and takes GPU ``SLURM_LOCALID`` (ranks/distributed.py), as torchrun, Horovod and MLPerf's launch scripts
  do; a rank whose local rank has no GPU of its own stops before the process group. Not per-task binding:
  ``--gpus-per-task=1`` implies ``--gpu-bind=per_task:1``, and any GPU binding makes task/cgroup
  (ConstrainDevices) fence each task off to its own GPU's device file (task_cgroup_devices.c: "This plugin
  constrain devices to task level"), which cuts CUDA IPC between the ranks of a node, NCCL's path over NVLink
  (NVIDIA/nccl#1066, open-mpi/ompi#11949); and ``--gpu-bind=none`` leaves the tasks of 22.05 without
  ``CUDA_VISIBLE_DEVICES`` at all (every GPU of the node shows where devices are not constrained). A site
  that wants one GPU per task anyway adds ``--gpus-per-task=1`` through launch.launcher_args; its ranks then
  see one GPU each and take cuda:0.
- CPUs, where the number per rank is known (launch.cpus_per_rank, else the job's ``SLURM_CPUS_PER_TASK``,
  else ``SLURM_JOB_CPUS_PER_NODE`` shared among a node's ranks): ``--cpus-per-task=C --cpu-bind=cores`` gives
  each rank its own C CPUs, and ``--distribution=block:block`` fills the first socket with local ranks
  0, 1, ... before the next, so rank i sits on the socket of GPU i where GPUs are numbered socket by socket
  (PCI order, as on DGX and ABCI nodes). Slurm's default ``block:cyclic`` deals ranks to the sockets in
  turn (rank 1 beside GPU 2's socket). Without C no binding is asked: a step then lays out one CPU per task,
  so ``block`` packs every rank onto the first socket and ``--cpu-bind=ldoms``/``sockets`` binds them all to
  it (task/affinity's _task_layout_lllp_block). Since Slurm 22.05 a step does not inherit
  ``--cpus-per-task`` from the batch job, so it is passed on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torus_train.job.hosts import Host, allocation_nodes, expand_nodelist, read_hostfile, slurm_hosts
from torus_train.job.launchers.base import (
    MAX_CPUS,
    MAX_NODE_GPUS,
    Launcher,
    LaunchError,
    LaunchPlan,
    PlanRequest,
    RankVars,
)
from torus_train.job.launchers.rendezvous import ephemeral_range, rendezvous_port
from torus_train.usernumbers import NumberError, env_int, int_of, shown

MAX_JOB_ID = 1 << 62
"""The largest Slurm job or step id read (Slurm's own are 32-bit)."""

# "srun: error: node2: task 3: Killed" (or "tasks 2-3")
TASK_ERROR = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+)")
SLURM = RankVars("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")
GPU_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS_PER_NODE")
"""What a job's environment says of its GPUs on a node: the count, the list, the request (``v100:4``)."""


def gpu_binding(ranks_on_node: int) -> list[str]:
    """One GPU per rank for the step, every GPU of a node visible to its ranks (module docstring)."""
    return [f"--gpus-per-node={ranks_on_node}"]


def cpu_binding(cpus: int) -> list[str]:
    """Each task its own ``cpus`` CPUs, local ranks filling one socket before the next (module docstring)."""
    return [f"--cpus-per-task={cpus}", "--cpu-bind=cores", "--distribution=block:block"]


def fewest_per_node(text: str) -> int:
    """The smallest count in ``$SLURM_JOB_CPUS_PER_NODE`` (``72(x2),36`` -> 36); 0 when it is empty; NumberError
    naming the variable when it is not in that form."""
    if not text.strip():
        return 0
    parts = [re.fullmatch(r"\s*([^(]*?)\s*(?:\(x[0-9]+\))?\s*", p) for p in text.split(",")]
    if not all(parts):
        raise NumberError(f"SLURM_JOB_CPUS_PER_NODE {shown(text)}: expected counts like 72(x2),36")
    return min(int_of(m.group(1), "SLURM_JOB_CPUS_PER_NODE", 1, MAX_CPUS) for m in parts if m)


def gpus_said(name: str, value: str) -> int | None:
    """GPUs on a node that one of GPU_VARIABLES says: a count, a list (``0,1``), a request (``v100:4``,
    ``gpu:2,gpu:2``); None when it cannot be read."""
    if name == "SLURM_JOB_GPUS":
        return len([v for v in value.split(",") if v.strip()]) or None
    counts = [item.rsplit(":", 1)[-1].strip() for item in value.split(",")]
    if not all(re.fullmatch(r"[0-9]+", c, re.ASCII) for c in counts):  # a GPU type without a count (v100)
        return None
    return sum(int_of(c, name, 0, MAX_NODE_GPUS) for c in counts)


def slurm_rendezvous(env: Mapping[str, str], ephemeral: tuple[int, int] | None = None) -> tuple[str, int] | None:
    """(first node of the step, port from job and step id) for ranks started by `srun` by hand; None outside
    a Slurm step. srun places rank 0 on the first node of the step's list (block and cyclic distributions)."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    job = env_int(env, "SLURM_JOB_ID", 0, MAX_JOB_ID)
    if not nodes or job is None:
        return None
    # SLURM_STEP_ID is not a number for the batch and extern steps ("batch", "extern"): 0 for them
    step_text = env.get("SLURM_STEP_ID", "0")
    step = int_of(step_text, "SLURM_STEP_ID", 0, MAX_JOB_ID) if re.match("[0-9]", step_text) else 0
    # job id x 16 + step: consecutive steps of one allocation get different ports; every node of a cluster
    # shares the ephemeral range, so every rank computes the same port
    key = str(job * 16 + step % 16)
    return expand_nodelist(nodes, allocation_nodes(env))[0], rendezvous_port(key, ephemeral or ephemeral_range())


class Srun(Launcher):
    name = "srun"
    program = "srun"
    auto_priority = 10  # inside an allocation its own launcher comes first, even with a hostfile
    allocation = "the Slurm allocation"
    rank_vars = (SLURM,)

    def auto(self, environ: Mapping[str, str], hostfile: str) -> str:
        return f"auto: inside Slurm job {environ['SLURM_JOB_ID']}" if environ.get("SLURM_JOB_ID") else ""

    def is_rank(self, environ: Mapping[str, str]) -> bool:
        # a step's task, not the batch script (which has SLURM_PROCID and SLURM_NTASKS but no step id)
        return "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ

    def rendezvous_by_hand(self, environ: Mapping[str, str]) -> tuple[str, int] | None:
        return slurm_rendezvous(environ)

    def culprit(self, lines: list[str]) -> tuple[int, str, str] | None:
        """srun lists every task that ended, often a survivor's exit code first: a task ended by a signal is
        preferred."""
        found = [m for ln in lines if (m := TASK_ERROR.search(ln))]
        if not found:
            return None
        m = next((m for m in found if "exit code" not in m.group(3).lower()), found[0])
        status = m.group(3).strip()
        return int(m.group(2)), m.group(1), "was killed by SIGKILL" if status == "Killed" else f"ended ({status})"

    def hosts(self, hostfile: str, environ: Mapping[str, str]) -> tuple[list[Host], str]:
        if hostfile:
            return read_hostfile(hostfile, "--hostfile"), hostfile
        if not environ.get("SLURM_JOB_ID"):
            raise LaunchError(
                "launcher srun needs a Slurm allocation: submit with sbatch (see scripts/slurm/) or run inside salloc"
            )
        return slurm_hosts(environ), ""

    def scheduler_cpus(self, environ: Mapping[str, str], ranks_on_node: int) -> tuple[int, str] | None:
        """The job's CPUs per task (``sbatch -c``), else the CPUs of the allocation's smallest node shared
        among its ranks."""
        per_task = env_int(environ, "SLURM_CPUS_PER_TASK", 0, MAX_CPUS)
        if per_task:  # 0, as unset: the node's CPUs below
            return per_task, "SLURM_CPUS_PER_TASK"
        per_node = environ.get("SLURM_JOB_CPUS_PER_NODE", "")
        share = fewest_per_node(per_node) // max(1, ranks_on_node)
        return (share, f"SLURM_JOB_CPUS_PER_NODE={per_node} over {ranks_on_node} ranks") if share else None

    def node_gpus(self, environ: Mapping[str, str]) -> tuple[int, str] | None:
        for name in GPU_VARIABLES:
            count = gpus_said(name, environ.get(name, ""))
            if count is not None:
                return count, f"{name}={environ[name]}"
        return None

    def gpu_ranks(self, req: PlanRequest) -> bool:
        """Whether the ranks take GPUs: comm.backend = nccl, or auto in an allocation whose environment names
        GPUs (a job without them runs CPU ranks, and asking for GPUs would fail the step)."""
        if req.backend != "auto":
            return req.backend == "nccl"
        found = self.node_gpus(req.environ)
        return found is not None and found[0] > 0

    def build(self, req: PlanRequest) -> LaunchPlan:
        g = req.grid
        cpus, gpus = self.rank_cpus(req), self.gpu_ranks(req)
        threads = cpus[0] if cpus else self.threads(req.environ, g.gpus_per_node, req.cpu_count, req.all_local())[0]
        argv = [self.program, f"--nodes={g.nodes}", f"--ntasks={g.size}", f"--ntasks-per-node={g.gpus_per_node}"]
        argv += (gpu_binding(g.gpus_per_node) if gpus else []) + (cpu_binding(cpus[0]) if cpus else [])
        # the ranks' variables go in srun's environment and --export=ALL carries them: srun splits --export
        # on commas, so NCCL_IB_HCA=mlx5_0,mlx5_1 inside it would lose everything after the first HCA
        argv += ["--kill-on-bad-exit=1", "--export=ALL"]
        if req.hostfile:
            argv.append(f"--nodelist={','.join(h.name for h in req.used)}")
        env = {"OMP_NUM_THREADS": str(threads), **req.env, **req.rendezvous()}
        notes = [gpu_note(req.backend, gpus), cpu_note(cpus)]
        return self.plan(req, [*argv, *req.launcher_args, *req.command], env, notes=notes)


def gpu_note(backend: str, gpus: bool) -> str:
    """What the plan's GPU binding is, in one line."""
    if gpus:
        return (
            "GPUs: one per rank: --gpus-per-node gives the step a GPU per rank on each node, all of them visible to "
            "the node's ranks (per-task binding would cut CUDA IPC, NCCL's NVLink path), and each rank takes GPU "
            "SLURM_LOCALID"
        )
    if backend == "gloo":
        return "GPUs: none (comm.backend = gloo: CPU ranks)"
    return (
        f"GPUs: not bound: the allocation names no GPUs ({', '.join(GPU_VARIABLES)}), so under comm.backend = auto "
        "the ranks take what CUDA shows them (none where Slurm manages the GPUs); ask for GPUs (sbatch "
        "--gpus-per-node) or pass --backend nccl"
    )


def cpu_note(cpus: tuple[int, str] | None) -> str:
    """What the plan's CPU binding is, in one line."""
    if cpus is None:
        return (
            "cores: not bound: Slurm does not say how many CPUs a node has (SLURM_CPUS_PER_TASK, "
            "SLURM_JOB_CPUS_PER_NODE); set launch.cpus_per_rank (a node's cores / its ranks)"
        )
    return (
        f"cores: {cpus[0]} CPU{'s' if cpus[0] > 1 else ''} per rank ({cpus[1]}), a node's ranks filling its first "
        f"socket first, beside GPUs 0, 1, ... ({' '.join(cpu_binding(cpus[0]))})"
    )
