#!/usr/bin/env python3
"""Predicted against measured step time of real `torus-train run` jobs on this machine (docs/plan.md).

    python scripts/plan_vs_run.py --grid 2x2 --grid 2x4 --json OUT.json [--repeats 2] [--steps 40]

For each repeat, and inside it for each grid in turn (so the grids alternate under similar load), back to back:
  1. calibrate: `torus-train bench allreduce --grid G --algo torus -b 1M -e 32M` (the sizes of ResNet-18's buckets);
  2. profile: one rank's step measured alone, 1 thread (`python -m torus_train.plan.host resnet18 ...`);
  3. run: `torus-train run` on G with the torus hook, ResNet-18 at 64 px on synthetic data, --batch images per
     rank, --steps steps, metrics every 5 steps;
  4. compare: `torus-train plan --compare-run RUN --calibrate BENCH --layer-profile PROF`, with the background
     load measured during each of 1 to 3 (scripts/measure_background.py: other runnable threads).
Each step is wrapped by measure_background.py, and the prediction is made twice: with the measured background
(the model's o = max(1, (ranks + background) / cores) for each of bench, profile and run) and with none.

Writes {"machine", "settings", "results": [{grid, repeat, measured_step_seconds, predicted_step_seconds, ratio,
bound, predicted_no_background_seconds, ratio_no_background, backgrounds, files}], "summary": {grid: {...}}}
and prints one line per result. Exit 0 when it ran (whatever the ratios), 1 when a step failed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def measured(cmd: list[str], log: Path, timeout: float) -> float:
    """Run cmd under measure_background.py; its log in `log`; returns the mean background (raises on failure)."""
    full = [PY, str(ROOT / "scripts" / "measure_background.py"), "--interval", "0.5", "--", *cmd]
    t = time.perf_counter()
    r = subprocess.run(full, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    log.write_text(f"$ {' '.join(cmd)}\n# {time.perf_counter() - t:.1f} s, rc {r.returncode}\n{r.stdout}\n{r.stderr}")
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed (rc {r.returncode}); see {log}")
    m = re.search(r"background: ([0-9.]+) runnable", r.stdout + r.stderr)
    return float(m.group(1)) if m else 0.0


def one(grid: str, rep: int, work: Path, args) -> dict:
    """Calibrate, profile, run and compare on one grid; returns the result row."""
    x, y = map(int, grid.split("x"))
    ranks = x * y
    d = work / f"{grid}_{rep}"
    d.mkdir(parents=True, exist_ok=True)
    bench, prof, run = d / "bench.json", d / "profile.json", d / "run"
    tt = [PY, "-m", "torus_train"]
    t0 = time.time()
    bg_bench = measured([*tt, "bench", "allreduce", "--grid", grid, "--algo", "torus", "-b", "1M", "-e", "32M",
                         "-n", str(args.bench_iters), "-w", "2", "--json", str(bench)], d / "bench.log", 900)
    bg_prof = measured([PY, "-m", "torus_train.plan.host", args.model, str(prof), "--image-size", str(args.image_size),
                        "--batch", str(args.batch), "--repeats", "5"], d / "profile.log", 600)
    p = json.loads(prof.read_text())
    p["background"] = bg_prof
    prof.write_text(json.dumps(p, indent=1) + "\n")
    bg_run = measured([*tt, "run", "--gpus", str(ranks), "--grid", grid, "--data", "synthetic", "--model", args.model,
                       "--image-size", str(args.image_size), "--steps", str(args.steps), "--out", str(run),
                       "--set", "comm.algo=torus", "--set", "job.log_every=5", "--set", "checkpoint.every_epochs=0",
                       "--set", "checkpoint.at_end=false", "--set", "eval.every_epochs=0",
                       "--set", f"schedule.stages=[{{until_epoch=1,per_rank_batch={args.batch}}}]",
                       "--set", "schedule.warmup_epochs=0"], d / "run.log", 1200)
    rows = {}
    for label, bb, br in (("with_background", bg_bench, bg_run), ("no_background", 0.0, 0.0)):
        pp = prof
        if label == "no_background":
            pp = d / "profile_no_background.json"
            pp.write_text(json.dumps(p | {"background": 0.0}, indent=1) + "\n")
        out = d / f"compare_{label}.json"
        r = subprocess.run([*tt, "plan", "--compare-run", str(run), "--calibrate", str(bench), "--layer-profile",
                            str(pp), "--cores", str(args.cores), "--background", f"{bb}", "--run-background", f"{br}",
                            "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
        (d / f"compare_{label}.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            raise RuntimeError(f"plan --compare-run failed: {r.stderr.strip()}")
        rows[label] = json.loads(out.read_text())["stages"][0]
    w, n = rows["with_background"], rows["no_background"]
    pred = w["prediction"]
    return {"grid": grid, "ranks": ranks, "repeat": rep, "started": time.strftime("%H:%M:%S", time.gmtime(t0)),
            "measured_step_seconds": w["measured_step_seconds"], "metrics_records_used": w["records_used"],
            "predicted_step_seconds": w["predicted_step_seconds"], "ratio": w["ratio"], "bound": pred["bound"],
            "timeline_step_seconds": pred["timeline_step_seconds"], "cores_step_seconds": pred["cores_step_seconds"],
            "exchanges_seconds": pred["bucket_seconds"], "oversubscription": pred["oversubscription"],
            "predicted_no_background_seconds": n["predicted_step_seconds"], "ratio_no_background": n["ratio"],
            "backgrounds": {"bench": bg_bench, "profile": bg_prof, "run": bg_run},
            "profile_ms": {k: p[k] * 1e3 for k in ("forward_seconds", "backward_seconds", "optimizer_seconds")},
            "files": str(d)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grid", action="append", default=None, help="XxY (repeatable; default 2x2 and 2x4)")
    ap.add_argument("--json", dest="json_path", required=True, help="write the results here")
    ap.add_argument("--workdir", default=None, help="folder for benches, profiles, runs [default: next to --json]")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the grids, alternating")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    ap.add_argument("--batch", type=int, default=16, help="images per rank per step")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--bench-iters", type=int, default=5)
    ap.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args()
    grids = args.grid or ["2x2", "2x4"]
    work = Path(args.workdir or Path(args.json_path).with_suffix("")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results, failed = [], None
    for rep in range(args.repeats):
        for g in grids:
            try:
                r = one(g, rep, work, args)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failed = f"{g} repeat {rep}: {e}"
                print(f"# FAILED {failed}", flush=True)
                break
            results.append(r)
            b = r["backgrounds"]
            print(f"{g} #{rep} ({r['started']} UTC): measured {r['measured_step_seconds'] * 1e3:.1f} ms, predicted "
                  f"{r['predicted_step_seconds'] * 1e3:.1f} ms, pred/meas {r['ratio']:.2f} ({r['bound']} bound; "
                  f"background bench {b['bench']:.2f} profile {b['profile']:.2f} run {b['run']:.2f}); with no "
                  f"background {r['predicted_no_background_seconds'] * 1e3:.1f} ms, {r['ratio_no_background']:.2f}",
                  flush=True)
        if failed:
            break
    summary = {}
    for g in grids:
        rs = [r for r in results if r["grid"] == g]
        if rs:
            summary[g] = {"runs": len(rs), "median_ratio": statistics.median(r["ratio"] for r in rs),
                          "median_ratio_no_background": statistics.median(r["ratio_no_background"] for r in rs),
                          "within_15_percent": sum(abs(r["ratio"] - 1) <= 0.15 for r in rs)}
    load = os.getloadavg()
    out = {"machine": {"cores": args.cores, "loadavg_at_end": load},
           "settings": {k: v for k, v in vars(args).items() if k != "json_path"} | {"grid": grids},
           "results": results, "summary": summary, "failed": failed}
    Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    for g, s in summary.items():
        print(f"# summary {g}: {s['runs']} run(s), median pred/meas {s['median_ratio']:.2f} (no background "
              f"{s['median_ratio_no_background']:.2f}), {s['within_15_percent']} within 15%")
    print(f"# wrote {args.json_path} (files under {work})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
