#!/usr/bin/env python3
"""Torus against NCCL's own choice, per network preset and GPU count: the table of docs/plan.md.

    python scripts/experiments/torus_vs_nccl.py                       # markdown table
    python scripts/experiments/torus_vs_nccl.py --json OUT            # also the rows as JSON
    python scripts/experiments/torus_vs_nccl.py --networks dgx-h100 --gpus 8,64

Every row is what `torus-train plan --gpus N --network NET` predicts with its defaults (ResNet-50, fp16
gradients, 32 images per GPU, the grid and bucket cap chosen by the predicted torus step, the fitted step
overhead): the torus on its chosen grid against `nccl` (the algorithm/protocol NCCL's tuning model picks per
bucket, torus_train.plan.nccl) on the same bucket timeline. "drives" names what decides the row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torus_train.errors import UserError
from torus_train.plan.networks import PRESETS
from torus_train.plan.search import bucket_sweep, make_plan
from torus_train.plan.verdict import TIE

NETWORKS = ("abci-v100", "dgx-h100", "goyal-p100-50gbe", "jia-p40-100gbe")
GPUS = (8, 64, 512, 2176, 4096)


def row(network: str, gpus: int) -> dict:
    """One (network, GPU count): both step times and efficiencies, the fused all-reduce of each, who wins."""
    net = PRESETS[network]
    p = make_plan(gpus, net, bucket_cap=None)
    t, n = p.algorithms["torus"], p.algorithms["nccl"]
    gain = (n.step_seconds - t.step_seconds) / n.step_seconds
    r = {
        "network": network,
        "gpus": gpus,
        "grid": p.grid,
        "bucket_cap_mb": p.bucket_cap_bytes / 2**20,
        "torus_step_ms": t.step_seconds * 1e3,
        "nccl_step_ms": n.step_seconds * 1e3,
        "torus_efficiency": t.scaling_efficiency,
        "nccl_efficiency": n.scaling_efficiency,
        "torus_exposed_ms": t.exposed_seconds * 1e3,
        "nccl_exposed_ms": n.exposed_seconds * 1e3,
        "torus_allreduce_ms": t.allreduce_seconds * 1e3,
        "nccl_allreduce_ms": n.allreduce_seconds * 1e3,
        "nccl_choice": n.nccl_choice,
        "torus_gain_fraction": gain,
        "winner": "tie" if abs(gain) < TIE else ("torus" if gain > 0 else "nccl"),
    }
    best = min(bucket_sweep(p, "nccl"), key=lambda c: c["step_seconds"])
    r["nccl_best_cap_mb"], r["nccl_best_cap_step_ms"] = best["cap_mb"], best["step_seconds"] * 1e3
    r["drives"] = drives(r, p)
    return r


def drives(r: dict, p) -> str:
    """What decides the row, from its own figures: the fused all-reduce ratio (bandwidth), and the last bucket,
    whose exchange is what stays exposed after the backward pass (latency: sequential steps)."""
    t, n = p.algorithms["torus"], p.algorithms["nccl"]
    ratio = r["torus_allreduce_ms"] / r["nccl_allreduce_ms"]
    tl, nl = t.timeline["buckets"][-1], n.timeline["buckets"][-1]
    return (
        f"fused all-reduce torus/NCCL {ratio:.2f}; last bucket ({tl['nbytes'] / 1e6:.1f} MB) torus "
        f"{tl['allreduce_seconds'] * 1e3:.2f} ms ({t.steps} steps) vs NCCL {nl['allreduce_seconds'] * 1e3:.2f} ms; "
        f"exposed torus {r['torus_exposed_ms']:.2f} ms, NCCL {r['nccl_exposed_ms']:.2f} ms"
    )


def markdown(rows: list[dict]) -> str:
    head = (
        "| network | GPUs | grid, cap | torus step ms (eff.) | NCCL step ms (eff.) | NCCL picks (fused) | winner | "
        "NCCL at its best cap | drives |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r['network']} | {r['gpus']} | {r['grid']}, {r['bucket_cap_mb']:g} MiB | "
        f"{r['torus_step_ms']:.2f} ({r['torus_efficiency'] * 100:.2f}%)"
        f" | {r['nccl_step_ms']:.2f} ({r['nccl_efficiency'] * 100:.2f}%) | {r['nccl_choice']} | "
        f"{_winner(r)} | {r['nccl_best_cap_step_ms']:.2f} ms at {r['nccl_best_cap_mb']:g} MiB | {r['drives']} |\n"
        for r in rows
    )


def _winner(r: dict) -> str:
    pct = abs(r["torus_gain_fraction"]) * 100
    return {"tie": f"tie ({pct:.1f}%)", "torus": f"torus by {pct:.1f}%", "nccl": f"**NCCL** by {pct:.1f}%"}[r["winner"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--gpus", default=",".join(map(str, GPUS)))
    ap.add_argument("--json", dest="json_path", default=None)
    a = ap.parse_args(argv)
    try:
        nets = a.networks.split(",")
        bad = [n for n in nets if n not in PRESETS]
        if bad:
            raise UserError(f"--networks: unknown preset {bad[0]!r}; presets: {', '.join(PRESETS)}")
        try:
            counts = [int(c) for c in a.gpus.split(",")]
        except ValueError:
            raise UserError(f"--gpus: {a.gpus!r} must be comma-separated positive integers") from None
        if any(c < 2 for c in counts):
            raise UserError(f"--gpus: {a.gpus!r}: every count must be >= 2")
        rows = [row(n, c) for n in nets for c in counts]
    except UserError as e:
        print(f"torus_vs_nccl.py: error: {e}", file=sys.stderr)
        return 2
    print(markdown(rows), end="")
    if a.json_path:
        Path(a.json_path).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"# wrote {a.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
