"""Trust the planned grid at full scale, in this one process: `plan --simulate` and `plan --check-groups`.

simulate_grid runs the torus's exact data movement on every virtual rank of the grid (torus_train.plan.simulate)
at ragged sizes; check_groups builds every row and column process group with the real
torus_train.comm.groups.build_grid_groups on torch's one-process fake backend. Only check_groups imports torch,
inside the function, so the rest of plan stays free of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torus_train.errors import RunFailed
from torus_train.job.topology import Grid
from torus_train.plan.simulate import check

MAX_CHECKED_RANKS = 65_536
"""--simulate and --check-groups build every rank (or every group) in this process; beyond this they take
minutes and gigabytes."""


def simulate_grid(grid: Grid, echo: Callable[[str], None]) -> dict:
    """Exact data movement on the grid's virtual ranks at 1, 7, 97 and a prime above the rank count elements;
    echoes one line per size; RunFailed unless every rank ends with the exact sum."""
    results = []
    for n in (1, 7, 97, next_prime(grid.size + 1)):
        r = check(grid.x, grid.y, n, seed=n)
        results.append(r.__dict__ | {"ok": r.ok})
        echo(
            f"# simulate {grid}: {r.ranks} virtual ranks, {n} int64 elements each: {r.steps} steps "
            f"(expected {r.expected_steps}), {r.wrong_ranks} ranks wrong, {r.seconds:.2f} s "
            f"-> {'exact sum on every rank' if r.ok else 'FAILED'}"
        )
    if not all(r["ok"] for r in results):
        raise RunFailed(f"virtual-rank torus on {grid} did not give every rank the exact sum")
    return {"grid": str(grid), "results": results}


def next_prime(n: int) -> int:
    """The smallest prime >= n."""

    def is_prime(k: int) -> bool:
        return k > 1 and all(k % d for d in range(2, int(k**0.5) + 1))

    while not is_prime(n):
        n += 1
    return n


def check_groups(grid: Grid, echo: Callable[[str], None]) -> dict:
    """Build every row and column group with the real build_grid_groups on the fake backend, as enough ranks
    that every group is checked from inside by one of its members: rank (i mod Y, i mod X), i < max(X, Y).
    Echoes one line; RunFailed when a group has the wrong members or a row or column went unchecked."""
    t0 = time.perf_counter()
    import torch.distributed  # noqa: F401  (timed: at small grids the imports are most of the cost)
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401

    from torus_train.comm.groups import build_grid_groups  # noqa: F401

    t_import = time.perf_counter() - t0
    as_ranks = sorted({grid.rank_at(i % grid.y, i % grid.x) for i in range(max(grid.x, grid.y))})
    t1 = time.perf_counter()
    rows_seen, cols_seen = set(), set()
    for rank in as_ranks:
        row, col = _check_as_rank(grid, rank)
        rows_seen.add(row)
        cols_seen.add(col)
    seconds = time.perf_counter() - t1
    built = (grid.y if grid.x > 1 else 0) + (grid.x if grid.y > 1 else 0)
    echo(
        f"# check-groups {grid}: built {built} process groups ({grid.y} rows of {grid.x}, {grid.x} columns "
        f"of {grid.y}) on the fake backend as each of {len(as_ranks)} ranks; every row and column group "
        f"has the right members ({seconds:.2f} s, torch import {t_import:.1f} s)"
    )
    ok = len(rows_seen) == grid.y and len(cols_seen) == grid.x
    if not ok:
        raise RunFailed(f"--check-groups: only {len(rows_seen)} rows and {len(cols_seen)} columns were checked")
    return {"grid": str(grid), "groups": built, "as_ranks": len(as_ranks), "seconds": seconds, "ok": ok}


def _check_as_rank(grid: Grid, rank: int) -> tuple[int, int]:
    """As `rank` of a fake-backend world: build the grid's groups and check this rank's row and column group
    members against the grid's. Returns (row, column)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torus_train.comm.groups import build_grid_groups

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=grid.size)
    try:
        g = build_grid_groups(grid)
        if grid.x > 1 and dist.get_process_group_ranks(g.row_group) != grid.row_ranks(g.row):
            raise RunFailed(f"--check-groups: rank {rank}'s row group is not row {g.row} of {grid}")
        if grid.y > 1 and dist.get_process_group_ranks(g.col_group) != grid.col_ranks(g.col):
            raise RunFailed(f"--check-groups: rank {rank}'s column group is not column {g.col} of {grid}")
        return g.row, g.col
    finally:
        dist.destroy_process_group()
