"""Inside a rank: who am I, where is rank 0, and the process groups (torch is imported inside the functions).

Rank, world size and local rank come from torchrun / our local launcher (RANK, WORLD_SIZE, LOCAL_RANK),
OpenMPI (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or PMI (PMI_RANK, PMI_SIZE).
The rendezvous address is MASTER_ADDR/MASTER_PORT, which `torus-train run` hands every rank it launches
(local, mpirun -x, srun --export). Ranks started by hand: under `srun` the first node of the step's node list
and a port from the Slurm job and step id (no MPI needed); under `mpirun` rank 0 picks a free port on its
host and broadcasts (host, port) with mpi4py, the only place a rank needs MPI to start.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Mapping

from torus_train.errors import RunFailed
from torus_train.job.rank import Bootstrap, RankInfo  # noqa: F401  (the value types, one floor down)
from torus_train.job.topology import Grid

_SOURCES = (
    # (name, rank, world size, local rank, local world size)
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """Read rank / world size / local rank from the first launcher environment that is present."""
    env = os.environ if environ is None else environ
    for name, r, n, lr, ln in _SOURCES:
        if r in env and n in env:
            rank, size = int(env[r]), int(env[n])
            local = int(env.get(lr, rank))
            lsize = env.get(ln, "")
            lsize_i = int(lsize) if lsize.isdigit() else size
            if not 0 <= rank < size:
                raise RunFailed(f"{name} environment says rank {rank} of {size}")
            return RankInfo(rank, size, local, lsize_i, name)
    return RankInfo(0, 1, 0, 1, "single")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def slurm_rendezvous(env: Mapping[str, str], ephemeral: tuple[int, int] | None = None) -> tuple[str, int] | None:
    """(first node of the step, port from job and step id) for ranks started by `srun` by hand; None outside
    a Slurm step. srun places rank 0 on the first node of the step's list (block and cyclic distributions)."""
    from torus_train.job.hosts import expand_nodelist
    from torus_train.job.launch import ephemeral_range, rendezvous_port

    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    job = env.get("SLURM_JOB_ID", "")
    if not nodes or not job.isdigit():
        return None
    step = env.get("SLURM_STEP_ID", "0")
    # job id x 16 + step: consecutive steps of one allocation get different ports; every node of a cluster
    # shares the ephemeral range, so every rank computes the same port
    key = str(int(job) * 16 + (int(step) % 16 if step.isdigit() else 0))
    return expand_nodelist(nodes)[0], rendezvous_port(key, ephemeral or ephemeral_range())


def rendezvous(info: RankInfo, environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(MASTER_ADDR, MASTER_PORT): from the environment; under srun by hand from the Slurm variables; under
    mpirun by hand rank 0's host and a free port broadcast with mpi4py."""
    env = os.environ if environ is None else environ
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return env["MASTER_ADDR"], int(env["MASTER_PORT"])
    if info.world_size == 1:
        return "127.0.0.1", free_port()
    if info.source == "slurm" and (found := slurm_rendezvous(env)) is not None:
        return found
    if info.source in ("openmpi", "pmi"):
        from mpi4py import MPI  # only ranks started by an MPI launcher get here

        comm = MPI.COMM_WORLD
        addr = (env.get("TORUS_TRAIN_MASTER_ADDR") or socket.gethostname(), free_port()) if comm.rank == 0 else None
        return comm.bcast(addr, root=0)
    raise RunFailed(f"rank {info.rank}: no MASTER_ADDR/MASTER_PORT in the environment and no MPI to broadcast "
                    "them; set both or start the job with `torus-train run`")


def _arch(name: str) -> tuple[str, int, int] | None:
    """'sm_90a' -> ('sm', 9, 0); None for a name that is not sm_/compute_ + digits."""
    kind, _, digits = name.partition("_")
    digits = "".join(c for c in digits if c.isdigit())
    if kind not in ("sm", "compute") or len(digits) < 2:
        return None
    return kind, int(digits[:-1]), int(digits[-1])


def gpu_arch_problem(capability: tuple[int, int], arch_list: list[str], gpu: str, torch_version: str,
                     cuda_version: str | None) -> str | None:
    """None when this torch build has kernels the GPU can run, else one line naming the GPU's capability and
    what to install. A GPU runs cubins (sm_XY) of its own major version and a minor not above its own, and PTX
    (compute_XY) of any version not above its own (JIT-compiled at start-up)."""
    major, minor = capability
    archs = [a for a in map(_arch, arch_list) if a is not None]
    if any((k == "sm" and M == major and m <= minor) or (k == "compute" and (M, m) <= (major, minor))
           for k, M, m in archs):
        return None
    have = ", ".join(arch_list) or "none"
    built = f"torch {torch_version} (CUDA {cuda_version})"
    sms = [(M, m) for k, M, m in archs if k == "sm"]
    if sms and (major, minor) < min(sms):  # an older GPU than the build supports: CUDA 13 dropped Volta (sm_70)
        hint = ("install a torch built with CUDA 12 (e.g. pip install torch torchvision --index-url "
                "https://download.pytorch.org/whl/cu126), or run in the container of Singularity.def")
    else:
        hint = "install a torch built with a newer CUDA (see https://pytorch.org/get-started/locally/)"
    return (f"GPU {gpu} has compute capability sm_{major}{minor}, which {built} has no kernels for "
            f"(it has {have}); {hint}")


def check_gpu_arch(device) -> None:
    """RunFailed with one line before the first kernel when this torch cannot run on the rank's GPU (instead of
    CUDA's "no kernel image is available" at the first step)."""
    import torch

    problem = gpu_arch_problem(torch.cuda.get_device_capability(device), torch.cuda.get_arch_list(),
                               torch.cuda.get_device_name(device), torch.__version__, torch.version.cuda)
    if problem:
        raise RunFailed(problem)


def init_distributed(grid: Grid, timeout_s: float, environ: Mapping[str, str] | None = None) -> Bootstrap:
    """Rank info -> device (its architecture checked against this torch build) -> process group (NCCL with CUDA,
    else gloo) with the timeout -> row/column groups."""
    import torch
    import torch.distributed as dist

    info = rank_info(environ)
    if info.world_size != grid.size:
        raise RunFailed(f"rank {info.rank}: the launcher started {info.world_size} ranks but grid {grid} needs "
                        f"{grid.size}")
    if torch.cuda.is_available():
        device = torch.device("cuda", info.local_rank % torch.cuda.device_count())
        check_gpu_arch(device)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    addr, port = rendezvous(info, environ)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=info.rank,
                            world_size=info.world_size, timeout=timedelta(seconds=timeout_s),
                            **({"device_id": device} if backend == "nccl" else {}))
    from torus_train.comm.groups import build_grid_groups

    groups = build_grid_groups(grid, timeout=timeout_s)
    return Bootstrap(info, grid, device, backend, groups)


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
