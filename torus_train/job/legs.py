"""A job as legs: runs of consecutive schedule stages on one grid (pure; no torch import).

Most jobs are one leg. When stages name their own grids (``schedule.stages[i].grid``, e.g. 2x1 and then 2x2,
or Sony's 32x34 and then 32x68), `torus-train run` runs the job leg by leg: the ranks of a leg stop at its end
epoch (``schedule.stop_epoch``) with a checkpoint, and the launcher starts the next leg's ranks on the new grid
from that checkpoint (resume with regrid), so that epochs, steps and the learning rate continue where they
stopped. The global batch of each stage is kept; its split over the ranks follows the stage's grid.

A leg's spec (``leg_spec``) is the job's spec with the leg's grid and, except for the last leg, a stop at the
leg's end with a checkpoint there.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

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


def plan_legs(spec: JobSpec) -> list[Leg]:
    """The job's legs in order, cut at schedule.stop_epoch; a stage without a grid runs on the job's grid, so
    it joins a neighbouring stage that names that same grid."""
    own = spec.grid.grid.replace(" ", "").lower()
    spans: list[list] = []
    for grid, start, end in spec.schedule.grid_spans():
        g = grid.replace(" ", "").lower()
        if spans and (spans[-1][0] or own) == (g or own):
            spans[-1][2] = end
            spans[-1][0] = spans[-1][0] or g
        else:
            spans.append([g, start, end])
    stop = spec.schedule.end_epoch
    spans = [[g, a, min(b, stop)] for g, a, b in spans if a < stop]
    return [Leg(g, a, b, i == len(spans) - 1) for i, (g, a, b) in enumerate(spans)]


def leg_spec(spec: JobSpec, leg: Leg) -> JobSpec:
    """The spec the ranks of one leg run: its grid, and a stop with a checkpoint at its end (but the last)."""
    s = copy.deepcopy(spec)
    if leg.grid:
        s.grid.grid, s.grid.gpus = leg.grid, parse_grid(leg.grid).size
    if not leg.last:
        s.schedule.stop_epoch, s.checkpoint.at_end = leg.until_epoch, True
    return s


def leg_at(legs: list[Leg], epoch: int) -> int:
    """Index of the leg that trains `epoch` (the last leg for an epoch at or past the end)."""
    return next((i for i, leg in enumerate(legs) if epoch < leg.until_epoch), len(legs) - 1)


def legs_text(legs: list[Leg]) -> str:
    """'epochs 0-1 on grid 2x1, then epochs 1-3 on grid 2x2'."""
    return ", then ".join(
        f"epochs {leg.start_epoch}-{leg.until_epoch} on grid {leg.grid or 'of the job'}" for leg in legs
    )
