"""The launcher table: one entry per way of starting ranks, each a class of pure methods in its own module
(no torch import). The spec's launch.launcher values, run's --launcher choices, `launch.launcher = auto`, the
launch plan and a rank's reading of its own place all come from here.

    local    N processes on this machine, started and supervised by `run` (local.py)
    mpirun   one OpenMPI command over a hostfile or a PBS node file (mpirun.py)
    srun     one Slurm step inside the allocation (srun.py)

To add one, see docs/extending.md ("Adding a launcher").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from torus_train.job.launchers.base import Launcher, LaunchError, LaunchPlan, PlanRequest, RankVars, threads_per_rank
from torus_train.job.launchers.local import Local
from torus_train.job.launchers.mpirun import Mpirun
from torus_train.job.launchers.srun import Srun
from torus_train.job.rank import RankInfo
from torus_train.registry import Registry

LAUNCHERS: Registry[Launcher] = Registry("launcher")
for _entry in (Local(), Mpirun(), Srun()):
    LAUNCHERS.add(_entry.name, _entry)

AUTO = "auto"
"""launch.launcher's value that lets `choose` pick an entry from the environment."""


def choices() -> tuple[str, ...]:
    """launch.launcher's allowed values: auto, then every entry in table order."""
    return (AUTO, *LAUNCHERS.names())


def entry(launcher: str | Launcher) -> Launcher:
    """The table entry of a launcher name (an entry is returned as it is); LaunchError for an unknown name."""
    if isinstance(launcher, Launcher):
        return launcher
    try:
        return LAUNCHERS.get(launcher)
    except ValueError as e:
        raise LaunchError(f"launch.launcher: {e}") from None


def choose(requested: str, environ: Mapping[str, str], hostfile: str) -> tuple[Launcher, str]:
    """(entry, why) for launch.launcher; auto asks the entries in auto_priority order and takes the first
    that says why it fits here."""
    if requested != AUTO:
        return entry(requested), f"launch.launcher = {requested}"
    for candidate in sorted(LAUNCHERS, key=lambda e: e.auto_priority):
        why = candidate.auto(environ, hostfile)
        if why:
            return candidate, why
    raise LaunchError("launch.launcher = auto: no launcher fits here; name one with --launcher")


def launched_by(environ: Mapping[str, str]) -> Launcher | None:
    """The launcher this process is already a rank of (`mpirun -n 4 torus-train run`), or None."""
    return next((e for e in LAUNCHERS if e.is_rank(environ)), None)


def rank_sources() -> Iterator[tuple[Launcher, RankVars]]:
    """Every launcher's own rank variables in table order, then the shared interfaces' (PMI)."""
    for e in LAUNCHERS:
        for v in e.rank_vars:
            yield e, v
    for e in LAUNCHERS:
        for v in e.shared_rank_vars:
            yield e, v


def read_rank(environ: Mapping[str, str]) -> tuple[RankInfo, Launcher | None]:
    """(this process's place, the launcher whose variables said so) from the first source present; a process
    that no launcher started is rank 0 of 1 (source 'single')."""
    for e, v in rank_sources():
        info = v.read(environ)
        if info is not None:
            return info, e
    return RankInfo(0, 1, 0, 1, "single"), None


def source_launcher(source: str) -> Launcher | None:
    """The entry whose rank variables are named `source` (RankInfo.source), or None."""
    return next((e for e, v in rank_sources() if v.source == source), None)


__all__ = [
    "AUTO",
    "LAUNCHERS",
    "LaunchError",
    "LaunchPlan",
    "Launcher",
    "PlanRequest",
    "RankVars",
    "choices",
    "choose",
    "entry",
    "launched_by",
    "rank_sources",
    "read_rank",
    "source_launcher",
    "threads_per_rank",
]
