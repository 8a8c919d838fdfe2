"""What a rank knows of itself after start-up, as plain values (no torch import): read by the training code,
filled in by torus_train.ranks.bootstrap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torus_train.job.topology import Grid


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks."""
    local_rank: int
    """Index on this node (selects the GPU)."""
    local_world_size: int
    """Ranks on this node."""
    source: str
    """Which environment said so: torchrun | openmpi | slurm | pmi | single."""


@dataclass
class Bootstrap:
    """What a rank holds after start-up."""

    info: RankInfo
    grid: Grid
    device: Any
    """torch.device: cuda:local_rank, or cpu."""
    backend: str
    """nccl or gloo."""
    groups: Any
    """torus_train.comm.groups.GridGroups (row and column groups of the grid)."""
