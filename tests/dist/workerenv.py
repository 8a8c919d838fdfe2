"""What the gloo workers of tests/dist share: joining the world their test started (run_local_ranks sets RANK,
WORLD_SIZE and MASTER_PORT). A worker runs by its path, so this folder is first on its sys.path."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def join_gloo(timeout_s: float = 60.0) -> tuple[int, int]:
    """One thread of torch per rank (ranks share the cores), then the gloo world on 127.0.0.1: (rank, world)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    return rank, world
