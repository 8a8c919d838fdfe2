"""Run the embedded default job (`torus-train run`) for several seeds and thread counts; print the table of
docs/recipe.md (seed, threads per rank, top-1 after each epoch, when the target was first passed, wall time).

    python scripts/experiments/recipe_seeds.py --out /tmp/recipe --seeds 0,1,2,3,4 --threads 1 --also 0:2
    python scripts/experiments/recipe_seeds.py --out /tmp/recipe --table-only       # the table of runs already there

Each run is `torus-train run --out OUT/seedS-tT --overwrite --set job.seed=S` with OMP_NUM_THREADS=T passed to
the ranks (launch.env), one after the other; extra `--set` arguments go to every run. Wall times are those of
this machine at that moment: on a shared machine they vary with the load, accuracies do not.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def parse_pairs(seeds: str, threads: str, also: list[str]) -> list[tuple[int, int]]:
    pairs = [(int(s), int(t)) for t in threads.split(",") for s in seeds.split(",")]
    pairs += [tuple(int(v) for v in a.split(":")) for a in also]
    return list(dict.fromkeys(pairs))


def run_one(out: Path, seed: int, threads: int, sets: list[str]) -> float:
    """One run; its wall time in seconds (start-up and data preparation included)."""
    cmd = [
        sys.executable,
        "-m",
        "torus_train",
        "run",
        "--out",
        str(out),
        "--overwrite",
        "--set",
        f"job.seed={seed}",
        "--set",
        f'launch.env=["OMP_NUM_THREADS={threads}"]',
    ]
    for s in sets:
        cmd += ["--set", s]
    print("$", " ".join(cmd), flush=True)
    t0 = time.monotonic()
    with open(out.parent / f"{out.name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    (out / "recipe_wall.json").write_text(json.dumps({"wall_seconds": wall, "rc": rc}))
    print(f"  exit {rc}, {wall:.1f} s", flush=True)
    return wall


def row(out: Path, seed: int, threads: int) -> dict:
    evals = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "eval":
            evals.append(rec["top1"])
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    wall = json.loads((out / "recipe_wall.json").read_text())["wall_seconds"]
    target = summary.get("target_top1", 0.9)
    first = next((i + 1 for i, t in enumerate(evals) if t >= target), None)
    return {
        "seed": seed,
        "threads": threads,
        "top1": evals,
        "first_epoch": first,
        "epochs": len(evals),
        "train_s": summary.get("wall_seconds"),
        "wall_s": wall,
        "digest": summary.get("param_digest", "")[:12],
        "target": target,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| seed | threads per rank | val top-1 after each epoch (%) | 90% first passed | training s | "
        "wall s (start to end) | replica digest |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        top = " ".join(f"{100 * t:.1f}" for t in r["top1"])
        first = f"after epoch {r['first_epoch']} of {r['epochs']}" if r["first_epoch"] else "not reached"
        train = f"{r['train_s']:.1f}" if r["train_s"] is not None else "-"
        lines.append(
            f"| {r['seed']} | {r['threads']} | {top} | {first} | {train} | {r['wall_s']:.1f} | {r['digest']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the runs (one subfolder each)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--threads", default="1", help="threads per rank, comma-separated (every seed with each)")
    ap.add_argument("--also", action="append", default=[], metavar="SEED:THREADS", help="one more run")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="passed to every run")
    ap.add_argument("--table-only", action="store_true", help="print the table of the runs already in --out")
    ap.add_argument("--json", default="", help="write the rows here too")
    a = ap.parse_args()
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed, threads in parse_pairs(a.seeds, a.threads, a.also):
        out = root / f"seed{seed}-t{threads}"
        if not a.table_only:
            run_one(out, seed, threads, a.sets)
        if (out / "recipe_wall.json").exists() and (out / "metrics.jsonl").exists():
            rows.append(row(out, seed, threads))
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    missed = [r for r in rows if not r["first_epoch"] or r["first_epoch"] >= r["epochs"]]
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
