"""Whether the torus beats NCCL's own choice on a plan's network: at the plan's point, and over GPU counts (pure).

Both sides on the bucket timeline with the plan's model, batch, dtype, bucket cap and overhead: the torus on its
fastest grid (grids.choose_grid_and_cap), NCCL as its tuning model picks per bucket (plan/nccl.py). Step times
within TIE of each other are a tie.
"""

from __future__ import annotations

from collections.abc import Iterable

from torus_train.job.algorithms import DEFAULT
from torus_train.job.topology import Grid
from torus_train.plan.cost import allreduce_seconds_fn
from torus_train.plan.grids import choose_grid_and_cap
from torus_train.plan.networks import Network
from torus_train.plan.search import Plan, bucket_sweep

VERDICT_COUNTS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 2176, 4096)
"""GPU counts the verdict scans for where the torus starts (or stops) beating NCCL."""

TIE = 0.005
"""Step times within this fraction of each other are a tie: the model cannot tell them apart."""


def torus_vs_nccl_step(gpus: int, net: Network, p: Plan) -> dict:
    """At `gpus` GPUs with p's model, batch, dtype, bucket cap and overhead: the torus on its fastest grid
    against what NCCL's tuning chooses, both on the bucket timeline. {gpus, grid, torus_step_seconds,
    nccl_step_seconds, torus_efficiency, nccl_efficiency, outcome: torus | nccl | tie}."""
    work = p.work
    best = choose_grid_and_cap(gpus, net, work, p.gradient_bytes, (p.bucket_cap_bytes / 2**20,))[0]
    g = Grid(gpus, 1, net.gpus_per_node)
    t = work.timeline("nccl", allreduce_seconds_fn("nccl", g, net), p.bucket_cap_bytes)
    return _outcome(
        {
            "gpus": gpus,
            "grid": best.grid,
            "torus_step_seconds": best.step_seconds,
            "nccl_step_seconds": t.step_seconds,
            "torus_efficiency": best.scaling_efficiency,
            "nccl_efficiency": t.scaling_efficiency,
        }
    )


def _outcome(row: dict) -> dict:
    """Add who wins the step (a tie within TIE) and the margin: nccl step - torus step, and over nccl's step."""
    gain = row["nccl_step_seconds"] - row["torus_step_seconds"]
    row["torus_gain_seconds"] = gain
    row["torus_gain_fraction"] = gain / row["nccl_step_seconds"]
    row["outcome"] = "tie" if abs(row["torus_gain_fraction"]) < TIE else (DEFAULT if gain > 0 else "nccl")
    return row


def verdict(p: Plan, counts: Iterable[int] = VERDICT_COUNTS) -> dict:
    """Whether the torus beats NCCL's own choice on p's network: at p's point (its grid), and over GPU counts,
    from which count on it starts (or stops) to. Returns {here, scan, text}; text is what plan prints."""
    t, n = p.algorithms[DEFAULT], p.algorithms["nccl"]
    here = _outcome(
        {
            "gpus": p.gpus,
            "grid": p.grid,
            "torus_step_seconds": t.step_seconds,
            "nccl_step_seconds": n.step_seconds,
            "torus_efficiency": t.scaling_efficiency,
            "nccl_efficiency": n.scaling_efficiency,
            "torus_allreduce_seconds": t.allreduce_seconds,
            "nccl_allreduce_seconds": n.allreduce_seconds,
            "nccl_choice": n.nccl_choice,
            "cap_mb": p.bucket_cap_bytes / 2**20,
        }
    )
    if p.overlap is None:
        best = min(bucket_sweep(p, "nccl"), key=lambda c: c["step_seconds"])
        here["nccl_best_cap_mb"], here["nccl_best_cap_step_seconds"] = best["cap_mb"], best["step_seconds"]
    counts = sorted({c for c in counts if c > 1} | {p.gpus})
    scan = [here if c == p.gpus else torus_vs_nccl_step(c, p.network, p) for c in counts]
    return {"here": here, "scan": scan, "text": verdict_text(here, scan, p.network.name)}


def verdict_text(here: dict, scan: list[dict], network: str) -> list[str]:
    """The verdict in words: who wins at this point and by how much per step, then where that changes."""
    ms = abs(here["torus_gain_seconds"]) * 1e3
    pct = abs(here["torus_gain_fraction"]) * 100
    who = {
        DEFAULT: f"the torus beats NCCL by {ms:.2f} ms per step ({pct:.1f}% of NCCL's step)",
        "nccl": f"NCCL beats the torus by {ms:.2f} ms per step ({pct:.1f}% of NCCL's step): the torus LOSES here",
        "tie": f"the torus and NCCL tie ({ms:.2f} ms per step apart, under {TIE * 100:g}%)",
    }[here["outcome"]]
    lines = [
        f"verdict on {network} at {here['gpus']} GPUs, grid {here['grid']}: {who} "
        f"(torus {here['torus_step_seconds'] * 1e3:.2f} ms, {here['torus_efficiency'] * 100:.2f}%; NCCL "
        f"{here['nccl_step_seconds'] * 1e3:.2f} ms, {here['nccl_efficiency'] * 100:.2f}%)"
    ]
    if "torus_allreduce_seconds" in here:
        ratio = here["torus_allreduce_seconds"] / here["nccl_allreduce_seconds"]
        lines.append(
            f"one fused all-reduce of the gradient: torus {here['torus_allreduce_seconds'] * 1e3:.3f} ms, "
            f"NCCL ({here['nccl_choice']}) {here['nccl_allreduce_seconds'] * 1e3:.3f} ms, torus/NCCL "
            f"{ratio:.2f}; the step hides most of either behind the backward pass"
        )
    if "nccl_best_cap_mb" in here:
        lines.append(
            f"NCCL at its own best bucket cap ({here['nccl_best_cap_mb']:g} MiB): "
            f"{here['nccl_best_cap_step_seconds'] * 1e3:.2f} ms per step (the comparison above gives both "
            f"the plan's cap, {here.get('cap_mb', 0):g} MiB)"
        )
    lines.append("over GPU counts: " + _where_it_changes(scan))
    return lines


def _where_it_changes(scan: list[dict]) -> str:
    """From which GPU count the torus starts (or stops) to beat NCCL, in words."""
    wins = [(r["gpus"], r["outcome"]) for r in scan]
    lo, hi = wins[0][0], wins[-1][0]
    kinds = {o for _, o in wins}
    if kinds == {DEFAULT}:
        return f"the torus wins at every count scanned ({lo}..{hi})"
    if kinds == {"nccl"}:
        return f"NCCL wins at every count scanned ({lo}..{hi}): the torus never pays off on this network"
    if DEFAULT not in kinds:
        return f"the torus never wins ({lo}..{hi}): NCCL wins or ties"
    first = next(n for n, o in wins if o == DEFAULT)
    last = max(n for n, o in wins if o == DEFAULT)
    after = [f"{n} {o}" for n, o in wins if n > last]
    contiguous = all(o == DEFAULT for n, o in wins if first <= n <= last)
    text = (
        f"the torus starts to win at {first} GPUs"
        if contiguous
        else f"the torus first wins at {first} GPUs, not at every count after"
    )
    text += f" and wins up to {last}" + (
        f", then stops ({', '.join(after)})" if after else " (the largest count scanned)"
    )
    return text + "; per count: " + ", ".join(f"{n} {o}" for n, o in wins)
