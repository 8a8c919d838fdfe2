#!/usr/bin/env python3
"""Side-by-side speed of the torus comm hook against DDP's own all-reduce, on the same `torus-train run`.

    python scripts/bench_hook.py                       # 4 CPU ranks on 2x2, resnet18 at 64 px, 30 steps, 2 rounds
    python scripts/bench_hook.py --algos ddp,torus,flat --rounds 3 --json bench_hook.json

Each round runs every algorithm once, in turn (so a noisy neighbour hurts all of them alike). A run's speed is
the median images/s of its metrics.jsonl intervals after the first (warm-up) one; an algorithm's figure is the
best of its rounds. The ratio is each algorithm's img/s over DDP's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(algo: str, args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "torus_train", "run", "--gpus", str(args.gpus), "--grid", args.grid,
           "--data", "synthetic", "--model", args.model, "--image-size", str(args.image_size),
           "--steps", str(args.steps), "--out", str(out), "--set", f"comm.algo={algo}",
           "--set", f"job.log_every={args.log_every}", "--set", "checkpoint.at_end=false",
           "--set", "checkpoint.every_epochs=0", "--set", "eval.every_epochs=0",
           "--set", f"schedule.stages=[{{until_epoch=4,global_batch={args.global_batch}}}]"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        sys.exit(f"bench_hook: {algo} run failed:\n{r.stderr[-2000:]}")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [m["images_per_second"] for m in lines if "images_per_second" in m][1:]
    summary = json.loads((out / "summary.json").read_text())
    return {"algo": algo, "img_s": statistics.median(rates), "intervals": len(rates),
            "wall_seconds": summary["wall_seconds"], "digests_agree": summary["param_digests_agree"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algos", default="ddp,torus", help="comma list of comm.algo values; ddp is the baseline")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--grid", default="2x2")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default=None, help="write the rows and ratios here")
    args = ap.parse_args()
    algos = args.algos.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for algo in algos:
                row = run_once(algo, args, Path(tmp) / f"{algo}-{rnd}")
                row["round"] = rnd
                rows.append(row)
                print(f"round {rnd} {algo:>12}: {row['img_s']:8.1f} img/s (median of {row['intervals']} "
                      f"intervals), wall {row['wall_seconds']:.1f} s", flush=True)
    best = {a: max(r["img_s"] for r in rows if r["algo"] == a) for a in algos}
    base = best.get("ddp", best[algos[0]])
    print(f"\n# {args.gpus} ranks on {args.grid}, {args.model} at {args.image_size} px, global batch "
          f"{args.global_batch}, {args.steps} steps, best of {args.rounds} round(s)")
    print(f"{'algo':>12}  {'img/s':>9}  {'ratio vs ddp':>12}")
    for a in algos:
        print(f"{a:>12}  {best[a]:9.1f}  {best[a] / base:12.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": vars(args), "rows": rows, "best_img_s": best,
                                               "ratio_vs_ddp": {a: best[a] / base for a in algos}}, indent=1))
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
