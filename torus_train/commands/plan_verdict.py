"""`plan`'s printout of the algorithms per DDP bucket and of the verdict torus against NCCL (no torch).

Kept beside commands/plan.py so the command stays a list of named calls: plan prints its table, then
print_buckets (each bucket's exchange per algorithm, with what NCCL chose for it) and print_verdict (does the
torus beat what NCCL would do anyway, by how much per step, and from which GPU count).
"""
from __future__ import annotations

import click

WIDTH = 11
"""Column width of the per-bucket table."""


def algorithm_notes(p) -> list[str]:
    """One line per algorithm name: what it stands for (textbook, ours, NCCL's), and NCCL's choice."""
    return [f"{a.algo:>13}: {a.label}" + (f"; for the fused gradient NCCL's model picks {a.nccl_choice}"
                                           if a.nccl_choice else "") for a in p.algorithms.values()]


def print_buckets(p) -> None:
    """Each DDP bucket's all-reduce time (ms) per algorithm, and the (algorithm/protocol) NCCL picks for it."""
    from torus_train.job.topology import parse_grid
    from torus_train.plan.cost import allreduce_cost

    first = next(iter(p.algorithms.values())).timeline
    if first is None:                                   # --overlap: one fused all-reduce, no buckets
        return
    algos = list(p.algorithms)
    grid = parse_grid(p.grid, p.network.gpus_per_node)
    click.echo("# per bucket, all-reduce ms (nccl: the algorithm/protocol its tuning picks for that size):")
    click.echo("# " + f"{'bucket':>6} {'MB':>7} " + " ".join(f"{a:>{WIDTH}}" for a in algos) + "  nccl picks")
    for b in first["buckets"]:
        ms = [p.algorithms[a].timeline["buckets"][b["index"]]["allreduce_seconds"] * 1e3 for a in algos]
        pick = allreduce_cost("nccl", grid, p.network, b["nbytes"], p.placement).nccl_choice
        click.echo("# " + f"{b['index']:>6} {b['nbytes'] / 1e6:>7.2f} " + " ".join(f"{x:>{WIDTH}.3f}" for x in ms)
                   + f"  {pick}")


def print_verdict(p) -> dict | None:
    """The torus against NCCL's own choice: printed, and returned for the JSON (None with --overlap or on a
    single GPU, where there is nothing to compare)."""
    from torus_train.plan.search import verdict

    if p.overlap is not None or "nccl" not in p.algorithms or p.gpus < 2:
        return None
    v = verdict(p)
    for line in v["text"]:
        click.echo(f"# {line}")
    return v
