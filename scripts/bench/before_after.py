"""Two checkouts side by side on this machine: the default job's wall time and top-1, and `bench allreduce`'s
busbw, run in alternation (before, after, before, after, ...) so that both see the same machine load.

    python scripts/bench/before_after.py --before ../old-checkout --after . --rounds 2 --json F

Each checkout runs as itself (PYTHONPATH set to its root, `python -m torus_train`), each run in a fresh
folder. Prints one table per measure and the after/before ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def torus(root: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "torus_train", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def default_run(root: Path, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        done = torus(root, "run", "--out", f"{tmp}/run", *extra)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"before_after: run in {root} failed:\n{done.stderr[-2000:]}")
        summary = json.loads(Path(tmp, "run", "summary.json").read_text())
    return {
        "wall_s": round(wall, 1),
        "top1": summary.get("val_top1"),
        "train_s": summary.get("wall_seconds"),
    }


def bench(root: Path, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        done = torus(root, "bench", "allreduce", "--json", f"{tmp}/b.json", *extra)
        if done.returncode != 0:
            sys.exit(f"before_after: bench allreduce in {root} failed:\n{done.stderr[-2000:]}")
        doc = json.loads(Path(tmp, "b.json").read_text())
    rows = doc["rows"] if isinstance(doc, dict) else doc
    big = max(r["size_bytes"] for r in rows)
    return {r["algo"]: round(r["busbw_gbps"], 4) for r in rows if r["size_bytes"] == big} | {"bytes": big}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path)
    ap.add_argument("--after", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--run-args", default="", help="extra `torus-train run` arguments (quoted)")
    ap.add_argument("--bench-args", default="", help="extra `bench allreduce` arguments (quoted)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    got: dict = {s: {"run": [], "bench": []} for s in sides}
    for i in range(args.rounds):
        for side, root in sides.items():
            got[side]["run"].append(default_run(root, args.run_args.split()))
            got[side]["bench"].append(bench(root, args.bench_args.split()))
            print(
                f"# round {i + 1} {side}: run {got[side]['run'][-1]}, bench {got[side]['bench'][-1]}",
                flush=True,
            )
    med = {s: statistics.median(r["wall_s"] for r in got[s]["run"]) for s in sides}
    print(f"{'':>10} {'run wall s (median)':>20} {'top-1':>8}")
    for s in sides:
        print(f"{s:>10} {med[s]:>20.1f} {got[s]['run'][-1]['top1']!s:>8}")
    print(f"# default run: after/before wall time {med['after'] / med['before']:.2f}")
    algos = [k for k in got["before"]["bench"][0] if k != "bytes"]
    for a in algos:
        b = statistics.median(r[a] for r in got["before"]["bench"])
        c = statistics.median(r.get(a, float("nan")) for r in got["after"]["bench"])
        print(
            f"# bench allreduce {a} busbw at {got['before']['bench'][0]['bytes']} B: before {b:.4f}, after {c:.4f} "
            f"GB/s, after/before {c / b:.2f}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"sides": {s: str(r) for s, r in sides.items()}, "results": got},
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
