"""`--elastic`: the spec for the ranks left when a node is lost for good (pure; no torch import).

The job continues on the remaining nodes with a grid chosen for them, keeping what the training depends on:
every stage's global batch (a per-rank batch becomes the global batch it had on the full grid) and so the
learning-rate schedule; each rank's forward pass keeps at most the micro-batch it ran before
(``schedule.max_per_rank_batch``), so the larger per-rank share is run as gradient accumulation.
"""

from __future__ import annotations

import copy

from torus_train.errors import UserError
from torus_train.job.spec import JobSpec
from torus_train.job.topology import Grid, choose_grid


class ElasticError(UserError):
    """The job cannot continue on fewer ranks (no node left, a global batch that does not divide)."""


def node_ranks(grid: Grid, node: int) -> range:
    k = grid.gpus_per_node
    return range(node * k, min((node + 1) * k, grid.size))


def shrink(spec: JobSpec, grid: Grid, lost_node: int, host: str = "") -> tuple[JobSpec, str]:
    """(spec without `lost_node`, the line that says what changed); ElasticError when it cannot continue.
    The caller takes the node's host out of the hostfile (launch.hostfile) where there is one."""
    lost = node_ranks(grid, lost_node)
    n = grid.size - len(lost)
    if n < 1:
        raise ElasticError("--elastic: no node is left to continue on")
    before = spec.schedule.at(grid.size)
    s = copy.deepcopy(spec)
    for st in s.schedule.stages:
        if st.grid:
            raise ElasticError("--elastic: stages that name their own grid cannot be shrunk")
        if st.per_rank_batch:
            st.global_batch, st.per_rank_batch = st.per_rank_batch * grid.size, 0
    s.schedule.max_per_rank_batch = max(info.micro_batch for info in before.stages)
    new = choose_grid(n, grid.gpus_per_node)[0]
    s.grid.grid, s.grid.gpus = str(new), n
    try:
        after = s.schedule.at(n)
    except UserError as e:
        raise ElasticError(f"--elastic: cannot continue on {n} ranks: {e}") from None
    now = after.stages[-1]
    where = f", host {host}" if host else ""
    text = (
        f"node {lost_node} (ranks {lost[0]}-{lost[-1]}{where}) failed in two attempts in a row: continuing "
        f"without it "
        f"on {n} ranks, grid {new}; the global batch stays {now.global_batch} ({n} ranks x {now.micro_batch}"
        f" x {now.accumulation} accumulated) and so does the learning-rate schedule"
    )
    return s, text
