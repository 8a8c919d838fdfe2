"""A job as legs: runs of consecutive schedule stages on one grid (pure; no torch import).

Most jobs are one leg. When stages name their own grids (``schedule.stages[i].grid``, e.g. 2x1 and then 2x2,
or Sony's 32x34 and then 32x68), `torus-train run` runs the job leg by leg: the ranks of a leg stop at its end
epoch (``schedule.stop_epoch``) with a checkpoint, and the launcher starts the next leg's ranks on the new grid
from that checkpoint (resume with regrid), so that epochs, steps and the learning rate continue where they
stopped. The global batch of each stage is kept; its split over the ranks follows the stage's grid.

A leg's spec (``leg_spec``) is the job's spec with the leg's grid and, except for the last leg, a stop at the
leg's end with a checkpoint there. Under ``schedule.control = "noise"`` a leg ends where the rule starts the
next grid's first stage (``schedule.stop_stage``), at the latest at the end planned here; the launcher then
plans the legs again from the starts the checkpoint holds and starts the next grid from it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from torus_train.job.control import CONTROLS
from torus_train.job.spec import JobSpec
from torus_train.job.topology import parse_grid


@dataclass(frozen=True)
class Leg:
    """Consecutive stages on one grid."""

    grid: str
    """XxY, or '' for the job's own grid (grid.grid / grid.gpus)."""
    start_epoch: int
    until_epoch: int
    last: bool
    next_grid_stage: int = 0
    """The first stage after this leg's on another grid (0: none). Under a control that decides when stages
    start (schedule.control = "noise") the leg's ranks stop when it starts (schedule.stop_stage)."""


def plan_legs(spec: JobSpec, starts: Sequence[int] = ()) -> list[Leg]:
    """The job's legs in order, cut at schedule.stop_epoch, with the stage starts the control decided so far
    (the rest at their latest); a stage without a grid runs on the job's grid, so it joins a neighbouring
    stage that names that same grid."""
    own = spec.grid.grid.replace(" ", "").lower()
    grids = [st.grid.replace(" ", "").lower() for st in spec.schedule.stages]
    spans: list[list] = []  # [grid, first epoch, end epoch, last stage index]
    for i, _, start, end in spec.schedule.resolved(starts).spans():
        g = grids[i]
        if spans and (spans[-1][0] or own) == (g or own):
            spans[-1][2], spans[-1][3] = end, i
            spans[-1][0] = spans[-1][0] or g
        else:
            spans.append([g, start, end, i])
    stop = spec.schedule.end_epoch
    spans = [[g, a, min(b, stop), k] for g, a, b, k in spans if a < stop]
    return [Leg(g, a, b, i == len(spans) - 1, _next_grid_stage(grids, own, k)) for i, (g, a, b, k) in enumerate(spans)]


def _next_grid_stage(grids: list[str], own: str, last: int) -> int:
    here = grids[last] or own
    return next((j for j in range(last + 1, len(grids)) if (grids[j] or own) != here), 0)


def leg_spec(spec: JobSpec, leg: Leg) -> JobSpec:
    """The spec the ranks of one leg run: its grid, and a stop with a checkpoint at its end (but the last);
    under a control that decides the stages' starts, a stop when the next grid's first stage starts."""
    s = copy.deepcopy(spec)
    if leg.grid:
        s.grid.grid, s.grid.gpus = leg.grid, parse_grid(leg.grid).size
    if not leg.last:
        s.schedule.stop_epoch, s.checkpoint.at_end = leg.until_epoch, True
    if CONTROLS[s.schedule.control].rule and leg.next_grid_stage:
        s.schedule.stop_stage, s.checkpoint.at_end = leg.next_grid_stage, True
    return s


def leg_at(legs: list[Leg], epoch: int) -> int:
    """Index of the leg that trains `epoch` (the last leg for an epoch at or past the end)."""
    return next((i for i, leg in enumerate(legs) if epoch < leg.until_epoch), len(legs) - 1)


def legs_text(legs: list[Leg]) -> str:
    """'epochs 0-1 on grid 2x1, then epochs 1-3 on grid 2x2'."""
    return ", then ".join(
        f"epochs {leg.start_epoch}-{leg.until_epoch} on grid {leg.grid or 'of the job'}" for leg in legs
    )
