#!/usr/bin/env python3
"""Side by side: the torus exchange of a step's buckets one after another (serial) and in two lanes (pipelined:
bucket k+1's row phase beside bucket k's column phase, torus_train/comm/pipeline.py), over the same buckets.

    python scripts/bench/bench_pipeline.py --grids 2x2,2x3 --rounds 7 --json pipeline.json
    python scripts/bench/bench_pipeline.py --grids 2x2 --rows gloo        # rows on gloo instead of shared memory

Each grid runs its ranks on this host (gloo; rows through shared memory unless --rows gloo). Every rank holds a
model whose parameters have ResNet-50's shapes (--model; --scale shrinks every tensor, for a quick run) in
BucketedModel with the run's buckets (at most 1 MiB first, then --bucket-mb), twice: once with the serial
exchange, once pipelined. A round runs one step of each (the order swapped every other round): the gradients are set by a
backward pass that costs almost nothing (every gradient is ones), so the step's time is the exchange's; a step
lasts from the start of backward to the end of finish() on the slowest rank. The first round warms up and is
not counted; each figure is the median of the others, with the range. Ratio: serial / pipelined (above 1: the
pipeline is faster). `overlap` is how long, in rank 0's last pipelined step, a row phase and a column phase
ran at the same time (the lanes' own clock); the JSON holds every phase's span.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # torus_train from this checkout, installed or not

MODES = ("serial", "pipelined")


def shapes(model: str, scale: float) -> list[int]:
    """The model's parameter sizes (torchvision, built on the meta device), each times scale (at least 1)."""
    import torch
    import torchvision

    with torch.device("meta"):
        m = torchvision.models.get_model(model, num_classes=1000)
    return [max(1, int(p.numel() * scale)) for p in m.parameters()]


def _bucketed(groups, sizes: list[int], bucket_mb: float, pipelined: bool):
    import torch

    from torus_train.comm.buckets import BucketedModel
    from torus_train.comm.hooks import TorusHookState

    module = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(n)) for n in sizes])
    state = TorusHookState(groups, algo="torus", pipelined=pipelined, timeline=pipelined)
    return BucketedModel(module, state, bucket_mb)


def _step(dp) -> float:
    """One step's backward (every gradient ones) and exchange on this rank: seconds until finish() returns."""
    import torch.distributed as dist

    dp.zero_grad()
    loss = sum(p.sum() for p in dp.module.parameters())  # backward yields the gradients last parameter first
    dist.barrier()
    t0 = time.perf_counter()
    loss.backward()
    dp.finish()
    return time.perf_counter() - t0


def _slowest(seconds: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def overlap_seconds(spans: list[dict]) -> float:
    """Time in which a row phase and a column phase ran at once (union of the row spans meets that of the column)."""

    def union(kind: str) -> list[tuple[float, float]]:
        out: list[list[float]] = []
        for a, b in sorted((s["start"], s["end"]) for s in spans if s["phase"].startswith(kind)):
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return [(a, b) for a, b in out]

    rows, cols = union("row"), union("column")
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in rows for c, d in cols)


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from torus_train.comm.groups import build_grid_groups
    from torus_train.job.topology import parse_grid

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank, world_size=world
    )
    groups = build_grid_groups(parse_grid(args.grid), use_shm=args.rows == "shm", timeout=300)
    sizes = shapes(args.model, args.scale)
    models = {m: _bucketed(groups, sizes, args.bucket_mb, m == "pipelined") for m in MODES}
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds + 1):  # round 0 warms up
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            dp = models[mode]
            if dp.torus_hook_state.timeline is not None:
                dp._lanes.spans.clear()
            seconds = _slowest(_step(dp))
            if r:
                times[mode].append(seconds)
    lanes = models["pipelined"]._lanes
    spans = sorted(lanes.spans, key=lambda s: s["start"]) if lanes is not None else []
    t0 = spans[0]["start"] if spans else 0.0
    if rank == 0:
        Path(args.worker_out).write_text(
            json.dumps(
                {
                    "grid": args.grid,
                    "rows": groups.rows.kind,
                    "buckets": [b.flat.numel() for b in models["serial"].buckets],
                    "lanes": type(lanes).__name__ if lanes is not None else None,
                    "seconds": times,
                    "overlap_seconds": overlap_seconds(spans),
                    "spans": [{**s, "start": s["start"] - t0, "end": s["end"] - t0} for s in spans],
                }
            )
        )
    for dp in models.values():
        dp.close()
    groups.close()
    dist.destroy_process_group()


def run_grid(args, grid: str) -> dict:
    from torus_train.ranks.bootstrap import free_port
    from torus_train.ranks.localrun import run_local_ranks

    x, y = map(int, grid.split("x"))
    world = x * y
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        argv = [sys.executable, __file__, "--worker", "--worker-out", str(out), "--grid", grid]
        argv += ["--rows", args.rows, "--rounds", str(args.rounds), "--model", args.model]
        argv += ["--scale", str(args.scale), "--bucket-mb", str(args.bucket_mb)]
        port = str(free_port())
        envs = [{"RANK": str(r), "WORLD_SIZE": str(world), "MASTER_PORT": port} for r in range(world)]
        run_local_ranks([argv] * world, envs, what=f"bench_pipeline {grid}")
        return json.loads(out.read_text())


def summarize(doc: dict) -> dict:
    """Median and range of each mode's step, the ratio serial / pipelined."""
    med = {m: statistics.median(doc["seconds"][m]) for m in MODES}
    return {
        "grid": doc["grid"],
        "rows": doc["rows"],
        "buckets": len(doc["buckets"]),
        "megabytes": sum(doc["buckets"]) * 4 / 1e6,
        **{f"{m}_seconds": med[m] for m in MODES},
        **{f"{m}_range": [min(doc["seconds"][m]), max(doc["seconds"][m])] for m in MODES},
        "ratio": med["serial"] / med["pipelined"],
        "overlap_seconds": doc["overlap_seconds"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grids", default="2x2,2x3", help="comma-separated XxY grids, each run in turn")
    ap.add_argument("--rows", choices=("shm", "gloo"), default="shm", help="the rows' exchange (default shm)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds after the warm-up one")
    ap.add_argument("--model", default="resnet50", help="torchvision model whose parameter shapes are used")
    ap.add_argument("--scale", type=float, default=1.0, help="every parameter tensor's size times this")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="bucket cap after the 1 MiB first bucket")
    ap.add_argument("--json", help="write the figures, every round and the phase spans here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--grid", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    print(
        f"# torus exchange of {args.model}'s buckets (x{args.scale:g}, 1 MiB then {args.bucket_mb:g} MiB), serial "
        f"against pipelined, gloo ranks on this host, {args.rounds} rounds after a warm-up; median (range) ms"
    )
    print(f"# {'grid':>5} {'rows':>5} {'buckets':>7} {'MB':>7} {'serial ms':>22} {'pipelined ms':>22} ", end="")
    print(f"{'serial/pipelined':>16} {'overlap ms':>10}")
    docs, rows = [], []
    for grid in args.grids.split(","):
        doc = run_grid(args, grid)
        s = summarize(doc)
        docs.append(doc)
        rows.append(s)
        cells = [
            f"{s[f'{m}_seconds'] * 1e3:8.1f} ({s[f'{m}_range'][0] * 1e3:.0f}-{s[f'{m}_range'][1] * 1e3:.0f})"
            for m in MODES
        ]
        print(
            f"  {s['grid']:>5} {s['rows']:>5} {s['buckets']:>7} {s['megabytes']:>7.1f} {cells[0]:>22} "
            f"{cells[1]:>22} {s['ratio']:>16.3f} {s['overlap_seconds'] * 1e3:>10.1f}"
        )
    if args.json:
        settings = {k: getattr(args, k) for k in ("grids", "rows", "rounds", "model", "scale", "bucket_mb")}
        Path(args.json).write_text(json.dumps({"settings": settings, "results": rows, "runs": docs}, indent=1))
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
