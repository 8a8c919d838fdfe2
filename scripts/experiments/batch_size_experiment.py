#!/usr/bin/env python
"""Batch-size control against fixed batches on the demo set, with `torus-train run` (4 local ranks, 2x2).

Three runs of the embedded default job, the same epochs and LR rule (linear scaling from base_lr at
lr_reference_batch, warm-up, decay), differing only in the global batch:
  (a) the small batch for every epoch, (b) the large batch for every epoch, (c) the default's stages
  (small -> ... -> large). Prints a markdown table (val top-1 per epoch, final and best, wall time, optimizer
  steps, time to the target) and writes the numbers to --json.

    python scripts/experiments/batch_size_experiment.py --out runs/bsexp --json runs/bsexp/results.json
    python scripts/experiments/batch_size_experiment.py --out /tmp/bs --configs c --set schedule.epochs=1   # one short run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import tomllib


def default_schedule() -> dict:
    text = resources.files("torus_train.specs").joinpath("default.toml").read_text()
    return tomllib.loads(text)["schedule"]


def stages_toml(stages: list[dict]) -> str:
    return "[" + ", ".join("{" + ", ".join(f"{k} = {v}" for k, v in s.items()) + "}" for s in stages) + "]"


def run_one(name: str, stages: list[dict], out: Path, extra: list[str]) -> dict:
    folder = out / name
    cmd = [
        sys.executable,
        "-m",
        "torus_train",
        "run",
        "--out",
        str(folder),
        "--overwrite",
        "--set",
        f"schedule.stages={stages_toml(stages)}",
        *extra,
    ]
    print(f"\n=== ({name}) stages {stages_toml(stages)}\n$ {' '.join(cmd)}", flush=True)
    t0 = time.time()
    r = subprocess.run(cmd, timeout=1800)
    wall = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"run {name} failed with exit code {r.returncode}")
    summary = json.loads((folder / "summary.json").read_text())
    evals = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "eval":
            evals.append((rec.get("epoch"), rec.get("top1")))
    return {"name": name, "stages": stages, "wall_seconds": round(wall, 1), "summary": summary, "evals": evals}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bsexp", help="folder for the three runs")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra spec overrides for all runs")
    ap.add_argument("--configs", default="a,b,c", help="which of the runs a, b, c to make (comma-separated)")
    args = ap.parse_args()
    chosen = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not chosen or set(chosen) - {"a", "b", "c"}:
        ap.error(f"--configs {args.configs}: expected some of a, b, c, comma-separated")
    sched = default_schedule()
    stages = sched["stages"]
    epochs = sched["epochs"]
    small, large = stages[0]["per_rank_batch"], stages[-1]["per_rank_batch"]
    extra = [x for s in args.sets for x in ("--set", s)]
    out = Path(args.out)
    configs = [
        ("a: fixed small", [{"until_epoch": epochs, "per_rank_batch": small}]),
        ("b: fixed large", [{"until_epoch": epochs, "per_rank_batch": large}]),
        ("c: batch-size control", stages),
    ]
    results = [run_one(n.split(":")[0], s, out, extra) | {"label": n} for n, s in configs if n[0] in chosen]
    print(
        f"\n{epochs} epochs each, base_lr {sched['base_lr']} per {sched['lr_reference_batch']} samples "
        f"({sched['lr_policy']}), warm-up {sched['warmup_epochs']}, decay {sched['decay']}\n"
    )
    head = "| run | batch per rank | steps | val top-1 per epoch | final top-1 | best | wall s | to target |"
    print(head)
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r["summary"]
        batch = " -> ".join(str(x["per_rank_batch"]) for x in r["stages"])
        per_epoch = " ".join(f"{100 * v:.1f}" for _, v in r["evals"] if v is not None)
        tt = s.get("time_to_target_seconds")
        target = f"epoch {s.get('time_to_target_epoch')}, {tt:.0f} s" if tt is not None else "not reached"
        print(
            f"| {r['label']} | {batch} | {s.get('steps')} | {per_epoch} | {100 * s['val_top1']:.1f}% | "
            f"{100 * s.get('best_top1', s['val_top1']):.1f}% | {r['wall_seconds']:.0f} | {target} |"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
