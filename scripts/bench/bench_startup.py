#!/usr/bin/env python
"""What one rank does before the first batch of an epoch, over an ImageNet-sized file index, per world size.

Writes an index of --files entries shaped like ImageNet's (1,000 class folders, names like
n01440764/n01440764_10026.JPEG; no image files are needed), then times, in a fresh process per measurement,
the steps a rank takes: open the index (memory-mapped), draw the epoch's permutation, take its shard, and build
the pipeline's file list and labels (the paths DALI is fed; no decoding). Each world size is measured for its
first and its last rank, in alternating rounds; the median round is reported.

    python scripts/bench/bench_startup.py --files 1281167 --worlds 8,2176 --json startup.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from torus_train.data.index import VERSION, _arrays, _write, arrays_checksum

ONE_RANK = """
import json, sys, time
t0 = time.perf_counter()
from torus_train.data.index import load_index
from torus_train.data.sharding import shard
t1 = time.perf_counter()
index, data, rank, world, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
split = load_index(index, data).split("train")
t2 = time.perf_counter()
sh = shard(len(split), rank, world, batch, epoch=1, seed=0)
t3 = time.perf_counter()
files = [split.files[i] for i in sh.indices]
labels = [int(split.labels[i]) for i in sh.indices]
t4 = time.perf_counter()
print(json.dumps({"load": t2 - t1, "shard": t3 - t2, "file_list": t4 - t3, "total": t4 - t1,
                  "entries": len(files), "import": t1 - t0}))
"""


def write_index(folder: Path, n: int, classes: int = 1000) -> Path:
    """An index of n ImageNet-like entries for a data folder that holds only its class folders."""
    data = folder / "data"
    wnids = [f"n{1440764 + 7 * c:08d}" for c in range(classes)]
    names, labels = [], []
    for count in (n, 50 * classes):  # train, val
        per = np.full(classes, count // classes)
        per[: count % classes] += 1
        names.append([f"{w}/{w}_{k}.JPEG" for c, w in enumerate(wnids) for k in range(per[c])])
        labels.append([c for c in range(classes) for _ in range(per[c])])
    meta = {"version": VERSION, "root": str(data.resolve()), "splits": {}, "seconds": 0.0}
    arrays = {}
    for split, ns, ls in zip(("train", "val"), names, labels, strict=True):
        for key, a in _arrays(ns, ls).items():
            arrays[f"{split}.{key}"] = a
        meta["splits"][split] = {"classes": wnids, "count": len(ns), "class_mtimes": []}
    meta["checksum"] = arrays_checksum(arrays)
    dest = folder / "index"
    _write(dest, meta, arrays, "--files")
    return dest


def measure(index: Path, data: Path, rank: int, world: int, batch: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", ONE_RANK, str(index), str(data), str(rank), str(world), str(batch)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1_281_167, help="training entries in the index")
    ap.add_argument("--worlds", default="8,2176", help="comma-separated world sizes")
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        t = time.time()
        index = write_index(Path(tmp), args.files)
        print(
            f"index of {args.files:,} entries written in {time.time() - t:.1f} s "
            f"({sum(f.stat().st_size for f in index.iterdir()) / 2**20:.0f} MiB)"
        )
        runs: dict[int, list[dict]] = {w: [] for w in worlds}
        for _ in range(args.rounds):
            for w in worlds:  # alternating: each round measures every world size once, first and last rank
                r0, rl = (
                    measure(index, Path(tmp) / "data", 0, w, args.batch),
                    measure(index, Path(tmp) / "data", w - 1, w, args.batch),
                )
                runs[w].append(max((r0, rl), key=lambda r: r["total"]))
    results = report(runs, args.files)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({"files": args.files, "batch": args.batch, "results": results}, indent=1) + "\n"
        )


def report(runs: dict[int, list[dict]], files: int) -> list[dict]:
    print(
        f"\nper rank before the first batch of an epoch, {files:,} files (median of {len(next(iter(runs.values())))}"
        " rounds, slower of the first and last rank):"
    )
    print(f"{'world':>6} {'entries/rank':>12} {'load s':>8} {'shard s':>8} {'file list s':>11} {'total s':>8}")
    results = []
    for w, rs in runs.items():
        med = sorted(rs, key=lambda r: r["total"])[len(rs) // 2]
        print(
            f"{w:>6} {med['entries']:>12,} {med['load']:>8.3f} {med['shard']:>8.3f} {med['file_list']:>11.3f} "
            f"{med['total']:>8.3f}"
        )
        results.append(
            {
                "world": w,
                "seconds_per_rank": round(med["total"], 4),
                "entries_per_rank": med["entries"],
                "load_s": round(med["load"], 4),
                "shard_s": round(med["shard"], 4),
                "file_list_s": round(med["file_list"], 4),
                "rounds_s": [round(r["total"], 4) for r in rs],
            }
        )
    base = results[0]["seconds_per_rank"]
    for r in results[1:]:
        print(f"world {r['world']} / world {results[0]['world']}: {r['seconds_per_rank'] / base:.2f}x")
    return results


if __name__ == "__main__":
    main()
