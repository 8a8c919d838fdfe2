"""The rehearsal's cost on this machine: `torus-train plan rehearse` of one spec with one rank and with several,
side by side, in one run: wall seconds, seconds per rehearsed rank (each rank runs both legs) and their ratio.

    python scripts/bench/bench_rehearse.py --spec scripts/specs/imagenet_2176.toml --json F

A rank's rehearsal does the same work at any world size (the groups are made by two splits, the trace does not
grow with the world), so the seconds per rank say what a longer --ranks list costs. Writes JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rehearse(spec: str, ranks: str, sets: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "torus_train", "plan", "rehearse", "--spec", spec, "--ranks", ranks]
        cmd += [a for s in sets for a in ("--set", s)] + ["--json", str(out)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"bench_rehearse: {' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        doc = json.loads(out.read_text())
    n = len(doc["ranks"])
    return {
        "ranks": doc["ranks"],
        "world": doc["world"],
        "wall_s": round(wall, 1),
        "per_rank_s": round(wall / n, 1),
        "ok": doc["ok"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="scripts/specs/imagenet_2176.toml")
    ap.add_argument("--few", default="0", help="the small rank list")
    ap.add_argument("--many", default="0,31,32,1087,2175", help="the large rank list")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [rehearse(args.spec, args.few, args.sets), rehearse(args.spec, args.many, args.sets)]
    print(f"# plan rehearse of {args.spec} at world {rows[0]['world']} on {os.cpu_count()} cores")
    print(f"{'ranks':>28} {'wall s':>8} {'s per rank':>11} {'verdict':>8}")
    for r in rows:
        print(
            f"{','.join(map(str, r['ranks'])):>28} {r['wall_s']:>8.1f} {r['per_rank_s']:>11.1f} "
            f"{'pass' if r['ok'] else 'FAIL':>8}"
        )
    ratio = rows[1]["per_rank_s"] / max(rows[0]["per_rank_s"], 1e-9)
    print(f"# seconds per rank, {len(rows[1]['ranks'])} ranks against {len(rows[0]['ranks'])}: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"spec": args.spec, "cores": os.cpu_count(), "rows": rows, "per_rank_ratio": round(ratio, 2)}, indent=1
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
