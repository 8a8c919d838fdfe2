"""The torus's grid: every factor pair X x Y = N weighed by the cost model (pure).

The grid decides the torus's cost. rank_grids and best_grid weigh every factor pair by its predicted fused
all-reduce (what `plan --overlap` goes by); choose_grid_and_cap weighs every (grid, bucket size) pair by the
predicted training step on the bucket timeline (StepWork: the step as the timeline sees it, whatever the grid),
which is how `plan` chooses; choose_grid is that choice as a plan makes it (the grid given, or one of the two).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torus_train.job.algorithms import DEFAULT
from torus_train.job.topology import Grid, GridError, check_grid_size, factor_pairs
from torus_train.plan.cost import BACKWARD_FRACTION, DTYPE_BYTES, AllreduceCost, allreduce_cost, allreduce_seconds_fn
from torus_train.plan.networks import Network
from torus_train.plan.timeline import BUCKET_BYTES, Layer, Timeline, timeline

BUCKET_CAPS_MB = (1, 2, 5, 10, 25, 50, 100, 200)
"""Bucket caps (MiB) that choose_grid_and_cap and search.bucket_sweep try."""


@dataclass(frozen=True)
class StepWork:
    """One training step as the bucket timeline weighs it on any grid: the same for every candidate grid, cap
    and algorithm of a plan."""

    layers: Sequence[Layer]
    """The model's parameter tensors in parameter order (timeline.model_layers, a measured profile's times where
    given)."""
    compute_seconds: float
    """Forward and backward on one GPU."""
    gradient_dtype: str
    """Dtype the gradients are exchanged in (cost.DTYPE_BYTES)."""
    overhead_seconds: float = 0.0
    """Paid unhidden by every step (the plan's step overhead times the compute)."""
    placement: str = "rows"
    """How ranks fill nodes: rows or columns."""

    def timeline(self, algo: str, cost: Callable[[float], float], bucket_cap: int) -> Timeline:
        """The step with the run's buckets of at most bucket_cap bytes, each all-reduced with `algo` in
        cost(bytes)."""
        return timeline(
            self.layers,
            self.compute_seconds,
            BACKWARD_FRACTION,
            cost,
            DTYPE_BYTES[self.gradient_dtype],
            algo,
            bucket_cap,
            overhead_seconds=self.overhead_seconds,
        )


def rank_grids(n: int, net: Network, nbytes: int, placement: str = "rows") -> list[tuple[Grid, AllreduceCost]]:
    """Every factor pair X x Y = n with its predicted torus all-reduce, fastest first (ties: fewer steps)."""
    out = []
    for x, y in factor_pairs(n):
        g = Grid(x, y, net.gpus_per_node)
        out.append((g, allreduce_cost(DEFAULT, g, net, nbytes, placement)))
    out.sort(key=lambda gc: (round(gc[1].seconds, 12), gc[1].steps, -gc[0].x))
    return out


def best_grid(n: int, net: Network, nbytes: int, placement: str = "rows") -> tuple[Grid, str]:
    """The grid with the fastest predicted torus all-reduce for n ranks, and why (against the runner-up and
    against the grid with the fewest steps)."""
    if not isinstance(n, int) or n < 1:
        raise GridError(f"--gpus must be a positive integer, got {n!r}")
    ranked = rank_grids(n, net, nbytes, placement)
    g, c = ranked[0]
    why = (
        f"fastest predicted torus of the {len(ranked)} factor pairs, {c.seconds * 1e3:.3f} ms, {c.steps} steps, "
        f"{_fit_to_nodes(g, n, net.gpus_per_node, placement)}"
    )
    if len(ranked) > 1:
        g2, c2 = ranked[1]
        why += f"; next best {g2} {c2.seconds * 1e3:.3f} ms"
    fewest = min(ranked, key=lambda gc: (gc[1].steps, -gc[0].x))
    if fewest[0] != g:
        why += (
            f"; the fewest-steps grid {fewest[0]} ({fewest[1].steps} steps) is predicted "
            f"{fewest[1].seconds * 1e3:.3f} ms: bandwidth, not step count, decides at this size"
        )
    return g, why


def _fit_to_nodes(g: Grid, n: int, k: int, placement: str) -> str:
    """How the rings that lie along the nodes (rows, or columns) meet nodes of k GPUs: what decides their links."""
    ring, side, what = (g.x, "rows", "horizontal") if placement == "rows" else (g.y, "columns", "vertical")
    return (
        "the whole job fits on one node"
        if n <= k
        else f"{side} inside one node: {what} rings on the intra-node links"
        if ring <= k and k % ring == 0
        else f"{side} span {math.ceil(ring / k)} nodes"
        if ring % k == 0
        else f"{side} and nodes do not line up"
    )


@dataclass
class Candidate:
    """One (grid, bucket cap) pair that choose_grid_and_cap compared, with its predicted torus step."""

    grid: str
    """XxY."""
    cap_mb: float
    """Bucket size (the run's comm.bucket_mb), MiB."""
    buckets: int
    """Buckets the model's gradients make at this cap."""
    allreduce_seconds: float
    """The fused all-reduce of the whole gradient on this grid (what the grid alone decides)."""
    exposed_seconds: float
    """Communication after the end of the backward pass, from the bucket timeline."""
    step_seconds: float
    """Predicted training step."""
    scaling_efficiency: float
    """compute / step."""


def choose_grid_and_cap(
    gpus: int, net: Network, work: StepWork, nbytes: int, caps_mb: Sequence[float] = BUCKET_CAPS_MB
) -> list[Candidate]:
    """The torus step on the bucket timeline for every (grid, bucket cap) pair, fastest first: every factor pair
    X x Y = gpus with every cap of caps_mb (each grid's links worked out once: allreduce_seconds_fn); nbytes is
    the fused gradient, whose all-reduce each candidate also records."""
    out = []
    for x, y in factor_pairs(gpus):
        g = Grid(x, y, net.gpus_per_node)
        cost = allreduce_seconds_fn(DEFAULT, g, net, work.placement)
        fused = cost(nbytes)
        for cap in caps_mb:
            t = work.timeline(DEFAULT, cost, int(cap * 2**20))
            out.append(
                Candidate(
                    f"{x}x{y}", cap, len(t.buckets), fused, t.exposed_seconds, t.step_seconds, t.scaling_efficiency
                )
            )
    # ties (within a nanosecond): fewer buckets, then longer rows
    return sorted(out, key=lambda c: (round(c.step_seconds, 9), c.buckets, -int(c.grid.split("x")[0])))


def why_chosen(cands: list[Candidate]) -> str:
    """Why the first candidate: its step, the runner-up's, the grid with the fastest fused all-reduce."""
    best = cands[0]
    grids = len({c.grid for c in cands})
    caps = len({c.cap_mb for c in cands})
    why = (
        f"fastest predicted step of {len(cands)} (grid, bucket cap) pairs ({grids} factor pairs x {caps} caps): "
        f"{best.step_seconds * 1e3:.3f} ms with "
        f"{best.cap_mb:g} MiB buckets ({best.buckets}), exposed {best.exposed_seconds * 1e3:.3f} ms"
    )
    other = next((c for c in cands[1:] if (c.grid, c.cap_mb) != (best.grid, best.cap_mb)), None)
    if other is not None:
        why += f"; next best {other.grid} at {other.cap_mb:g} MiB {other.step_seconds * 1e3:.3f} ms"
    fused = min(cands, key=lambda c: (c.allreduce_seconds, -int(c.grid.split("x")[0])))
    if fused.grid != best.grid:
        step = min(c.step_seconds for c in cands if c.grid == fused.grid)
        why += (
            f"; the grid with the fastest single all-reduce, {fused.grid} ({fused.allreduce_seconds * 1e3:.3f} "
            f"ms), gives {step * 1e3:.3f} ms per step: the timeline, not the fused all-reduce, decides"
        )
    return why


def choose_grid(
    gpus: int,
    net: Network,
    grid: Grid | None,
    nbytes: int,
    work: StepWork,
    overlap: float | None,
    bucket_cap: int | None,
) -> tuple[Grid, int, str, list[Candidate]]:
    """(grid, bucket cap, why, candidates) of a plan: the grid given; else with --overlap the fastest fused
    all-reduce; else the (grid, cap) pair of the fastest step (choose_grid_and_cap; the cap fixed when given)."""
    cap = BUCKET_BYTES if bucket_cap is None else bucket_cap
    if grid is not None:
        check_grid_size(grid, gpus)
        grid = Grid(grid.x, grid.y, net.gpus_per_node)
        return grid, cap, f"given by --grid ({grid.torus_steps} torus steps)", []
    if overlap is not None:
        grid, why = best_grid(gpus, net, nbytes, work.placement)
        return grid, cap, why, []
    candidates = choose_grid_and_cap(gpus, net, work, nbytes, BUCKET_CAPS_MB if bucket_cap is None else (cap / 2**20,))
    best = candidates[0]
    x, y = map(int, best.grid.split("x"))
    return Grid(x, y, net.gpus_per_node), int(best.cap_mb * 2**20), why_chosen(candidates), candidates
