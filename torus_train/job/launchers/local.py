"""`local`: N worker processes on this machine, which `run` starts and supervises itself (no torch import).

Each rank gets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / MASTER_ADDR / MASTER_PORT, the variables
torchrun sets, so a rank cannot tell the two apart and needs nothing else to find rank 0.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Mapping

from torus_train.job.hosts import Host
from torus_train.job.launchers.base import MAX_WORLD, Launcher, LaunchError, LaunchPlan, PlanRequest, RankVars
from torus_train.job.topology import Grid
from torus_train.usernumbers import env_int

MAX_LOCAL_CPU_RANKS = 8
"""CPU ranks (no GPU) one machine runs at least, whatever its core count: gloo ranks time-share cores."""
MAX_LOCAL_RANKS = 1024
"""Ranks started on one machine at most, whatever its GPUs or cores (`run` and `bench allreduce` alike): a larger
world is started by mpirun or srun across nodes."""
TORCHRUN = RankVars("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
"""Which attempt torchrun's agent started its ranks in (0 the first; `torchrun --max-restarts` counts up)."""


def torchrun_attempt(environ: Mapping[str, str]) -> int:
    """This rank's attempt under torchrun's restarts (0: the first, or not started by torchrun)."""
    return env_int(environ, RESTART_COUNT, 0, MAX_WORLD) or 0


def agent_started_at(pid: int) -> float | None:
    """When process `pid` (a rank's torchrun agent: its parent) started, in seconds since the epoch, from
    /proc (Linux); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(ln.split()[1]) for ln in f if ln.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class Local(Launcher):
    name = "local"
    runs_here = True
    auto_priority = 90  # the fallback: no scheduler and no hostfile
    rank_vars = (TORCHRUN,)

    def auto(self, environ: Mapping[str, str], hostfile: str) -> str:
        return "auto: no hostfile and no scheduler, so ranks start on this machine"

    def is_rank(self, environ: Mapping[str, str]) -> bool:
        # torchrun sets TORCHELASTIC_RUN_ID; our own ranks (and torchrun's) RANK and WORLD_SIZE
        return "TORCHELASTIC_RUN_ID" in environ or ("RANK" in environ and "WORLD_SIZE" in environ)

    def hosts(self, hostfile: str, environ: Mapping[str, str]) -> tuple[list[Host], str]:
        return [Host("localhost", 0)], ""

    def default_world(self, hosts: list[Host], local_gpus: int) -> int:
        return max(local_gpus, 1)

    def default_per_node(self, world: int, hosts: list[Host]) -> int:
        return world

    def check_capacity(self, grid: Grid, hosts: list[Host], hostfile: str, local_gpus: int, cpu_count: int) -> None:
        n = grid.size
        limit = local_gpus if local_gpus else max(MAX_LOCAL_CPU_RANKS, cpu_count)
        if n <= min(limit, MAX_LOCAL_RANKS):
            return
        if n <= limit:  # the machine would hold them, but no machine is given more than the cap
            raise LaunchError(
                f"{n} ranks: at most {MAX_LOCAL_RANKS} start on one machine; start more across nodes with "
                "--hostfile FILE (mpirun) or from inside a Slurm or PBS job, lower --gpus/--grid, or add --dry-run to "
                "only print the plan"
            )
        elsewhere = (
            f"to launch grid {grid} pass --hostfile FILE ('host slots=K' per node, e.g. K=4 for "
            f"{math.ceil(n / 4)} nodes; mpirun), submit from inside a Slurm or PBS job (scripts/slurm/, "
            "scripts/pbs/), lower --gpus/--grid, or add --dry-run to only print the plan"
        )
        if local_gpus:  # NCCL runs one rank per GPU: two ranks on one device fail ("Duplicate GPU detected")
            raise LaunchError(
                f"{n} ranks do not fit on this machine ({local_gpus} GPU(s), one rank each); to run "
                f"them here as CPU ranks pass --backend gloo, {elsewhere}"
            )
        raise LaunchError(f"{n} ranks do not fit on this machine (no GPU: at most {limit} CPU ranks); {elsewhere}")

    def build(self, req: PlanRequest) -> LaunchPlan:
        n = req.grid.size
        threads, _ = self.threads(req.environ, n, req.cpu_count, True)
        rank_env = [
            {
                "RANK": str(r),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": str(n),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(req.port),
            }
            for r in range(n)
        ]
        return self.plan(
            req,
            req.command,
            {"OMP_NUM_THREADS": str(threads), **req.env},
            hosts=[Host("localhost", n)],
            rank_env=rank_env,
            notes=self.notes(n, req.local_gpus, threads),
        )

    @staticmethod
    def notes(n: int, gpus: int, threads: int) -> list[str]:
        """What the ranks run on; one rank on one GPU has no peer, so say how to see the torus exchange."""
        if not gpus:
            return [f"{n} CPU rank{'s' if n > 1 else ''} on gloo, {threads} thread(s) each"]
        if n == 1:
            return [
                "one rank on one GPU (grid 1x1): its all-reduce has no peer; to see the torus, run "
                "CPU ranks (--backend gloo --gpus 4) or on a machine with more GPUs"
            ]
        return [f"{n} ranks on NCCL, one per GPU ({gpus} here)"]

    def command_text(self, plan: LaunchPlan) -> str:
        first = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**plan.rank_env[0], **plan.env}.items())
        return (
            f"{first} {shlex.join(plan.argv)}\n  (x{plan.world_size} ranks, RANK/LOCAL_RANK 0..{plan.world_size - 1})"
        )
