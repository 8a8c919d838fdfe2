"""A rank's torch.distributed start-up and shutdown: device, process group, grid groups (imports torch; the
pure half, whose rank am I and where is rank 0, is torus_train.ranks.bootstrap)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from torus_train.comm.groups import build_grid_groups
from torus_train.errors import RunFailed
from torus_train.job.launchers.local import torchrun_attempt
from torus_train.job.rank import Bootstrap, RankInfo
from torus_train.job.topology import Grid
from torus_train.ranks.bootstrap import gpu_arch_problem, rank_gpu, rank_info, rendezvous


def check_gpu_arch(device) -> None:
    """RunFailed with one line before the first kernel when this torch cannot run on the rank's GPU (instead of
    CUDA's "no kernel image is available" at the first step)."""
    problem = gpu_arch_problem(
        torch.cuda.get_device_capability(device),
        torch.cuda.get_arch_list(),
        torch.cuda.get_device_name(device),
        torch.__version__,
        torch.version.cuda,
    )
    if problem:
        raise RunFailed(problem)


def init_distributed(
    grid: Grid, timeout_s: float, environ: Mapping[str, str] | None = None, backend: str | None = None
) -> Bootstrap:
    """Rank info -> device (its architecture checked against this torch build) -> process group with the
    timeout -> row/column groups. backend: None = NCCL with CUDA, else gloo; 'gloo' keeps the ranks on the
    CPU even where there are GPUs (bench --backend gloo)."""
    info = rank_info(environ)
    if info.world_size != grid.size:
        raise RunFailed(
            f"rank {info.rank}: the launcher started {info.world_size} ranks but grid {grid} needs {grid.size}"
        )
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        # no GPU, or a local rank past the GPUs CUDA shows: refused here before the process group (the launcher
        # refuses it before launch where it can know: job/gpus.py, Launcher.check_gpus)
        index = rank_gpu(info, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        device = torch.device("cuda", index)
        check_gpu_arch(device)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend,
        **_meeting_point(info, os.environ if environ is None else environ, timeout),
        rank=info.rank,
        world_size=info.world_size,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
    )
    groups = build_grid_groups(grid, timeout=timeout_s)
    return Bootstrap(info, grid, device, backend, groups)


def _meeting_point(info: RankInfo, environ: Mapping[str, str], timeout: timedelta) -> dict:
    """init_process_group's rendezvous: rank 0's address, or under a restart by torchrun the agent's store with
    a key space of this attempt's own. The agent keeps one store across its restarts and torch's keys do not
    change between attempts, so a rank could read the address of an earlier attempt's rank and fail to connect
    (seen in 4 of 6 `torchrun --max-restarts 1` runs here, gloo's "connectFullMesh failed ... Connection
    refused"; NCCL's unique id is kept in the same store)."""
    addr, port = rendezvous(info, environ)
    attempt = torchrun_attempt(environ)
    if not attempt or environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {"init_method": f"tcp://{addr}:{port}"}
    store = dist.TCPStore(addr, port, info.world_size, is_master=False, timeout=timeout)
    return {"store": dist.PrefixStore(f"torus-train/attempt{attempt}", store)}


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
