"""Inside a rank, before torch: who am I and where is rank 0 (pure; the process groups: ranks/distributed.py).

Rank, world size and local rank come from the variables of the launcher that started this process, as its
entry in torus_train.job.launchers lists them: torchrun / our local launcher (RANK, WORLD_SIZE, LOCAL_RANK),
OpenMPI (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or PMI (PMI_RANK, PMI_SIZE).
The rendezvous address is MASTER_ADDR/MASTER_PORT, which `torus-train run` hands every rank it launches
(local, mpirun -x, srun --export). Ranks started by hand ask their launcher's entry: under `srun` the first
node of the step's node list and a port from the Slurm job and step id (no MPI needed); under `mpirun` rank 0
picks a free port on its host and broadcasts (host, port) with mpi4py, the only place a rank needs MPI to start.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from torus_train.errors import RunFailed
from torus_train.job.launchers import read_rank, source_launcher
from torus_train.job.rank import RankInfo
from torus_train.usernumbers import env_int


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """Read rank / world size / local rank from the first launcher environment that is present."""
    return read_rank(os.environ if environ is None else environ)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def mpi_rendezvous(env: Mapping[str, str]) -> tuple[str, int]:
    """(rank 0's host, a free port there), broadcast from rank 0 over MPI: ranks that mpirun started by hand."""
    from mpi4py import MPI  # only ranks started by an MPI launcher get here

    comm = MPI.COMM_WORLD
    addr = (env.get("TORUS_TRAIN_MASTER_ADDR") or socket.gethostname(), free_port()) if comm.rank == 0 else None
    return comm.bcast(addr, root=0)


def rendezvous(info: RankInfo, environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT): from the environment; for ranks started by hand, from the launcher whose
    variables named the rank (srun: the Slurm variables; mpirun: rank 0's host and port over mpi4py)."""
    env = os.environ if environ is None else environ
    port = env_int(env, "MASTER_PORT", 1, 65535)
    if env.get("MASTER_ADDR") and port is not None:
        return env["MASTER_ADDR"], port
    if info.world_size == 1:
        return "127.0.0.1", free_port()
    launcher = source_launcher(info.source)
    if launcher is not None and (found := launcher.rendezvous_by_hand(env)) is not None:
        return found
    raise RunFailed(
        f"rank {info.rank}: no MASTER_ADDR/MASTER_PORT in the environment and no MPI to broadcast "
        "them; set both or start the job with `torus-train run`"
    )


def _arch(name: str) -> tuple[str, int, int] | None:
    """'sm_90a' -> ('sm', 9, 0); None for a name that is not sm_/compute_ + digits."""
    kind, _, digits = name.partition("_")
    digits = "".join(c for c in digits if c.isdigit())
    if kind not in ("sm", "compute") or len(digits) < 2:
        return None
    return kind, int(digits[:-1]), int(digits[-1])


def gpu_arch_problem(
    capability: tuple[int, int], arch_list: list[str], gpu: str, torch_version: str, cuda_version: str | None
) -> str | None:
    """None when this torch build has kernels the GPU can run, else one line naming the GPU's capability and
    what to install. A GPU runs cubins (sm_XY) of its own major version and a minor not above its own, and PTX
    (compute_XY) of any version not above its own (JIT-compiled at start-up)."""
    major, minor = capability
    archs = [a for a in map(_arch, arch_list) if a is not None]
    if any(
        (k == "sm" and major == M and m <= minor) or (k == "compute" and (M, m) <= (major, minor)) for k, M, m in archs
    ):
        return None
    have = ", ".join(arch_list) or "none"
    built = f"torch {torch_version} (CUDA {cuda_version})"
    sms = [(M, m) for k, M, m in archs if k == "sm"]
    if sms and (major, minor) < min(sms):  # an older GPU than the build supports: CUDA 13 dropped Volta (sm_70)
        hint = (
            "install a torch built with CUDA 12 (e.g. pip install torch torchvision --index-url "
            "https://download.pytorch.org/whl/cu126), or run in the container of Singularity.def"
        )
    else:
        hint = "install a torch built with a newer CUDA (see https://pytorch.org/get-started/locally/)"
    return (
        f"GPU {gpu} has compute capability sm_{major}{minor}, which {built} has no kernels for (it has {have}); {hint}"
    )


def rank_gpu(info: RankInfo, count: int, visible: str | None) -> int:
    """The CUDA device a rank takes among the ``count`` GPUs CUDA shows it (``visible``: its
    CUDA_VISIBLE_DEVICES, None when unset): one GPU means the launcher gave this rank its own (srun
    --gpus-per-task=1, --gpu-bind=single:1, a per-rank cgroup), so it is cuda:0; several mean the node's ranks share
    the list and each takes its local rank. A local rank past the list would share a GPU with a lower one,
    which NCCL refuses after start-up ("Duplicate GPU detected"): RunFailed in one line before anything starts."""
    if count == 0:
        raise RunFailed(
            f"rank {info.rank}: comm.backend = nccl, but CUDA shows this rank no GPU "
            f"(CUDA_VISIBLE_DEVICES={visible if visible is not None else '(unset)'}); pass --backend gloo for CPU ranks"
        )
    if count == 1 or info.local_rank < count:
        return 0 if count == 1 else info.local_rank
    raise RunFailed(
        f"rank {info.rank}: local rank {info.local_rank} of {info.local_world_size} on this node has no GPU of its "
        f"own: CUDA shows {count} GPU(s) here (CUDA_VISIBLE_DEVICES={visible if visible is not None else '(unset)'}), "
        f"and two ranks on one GPU fail in NCCL; start at most {count} ranks per node (grid.gpus_per_node), give "
        "each rank its own GPU, or pass --backend gloo for CPU ranks"
    )
