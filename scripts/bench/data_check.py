#!/usr/bin/env python
"""How `torus-train data check --decode` scales with the number of files: per set size, img/s and img/s per
core, and the ratio of the per-file cost between the largest and the smallest set (1.0 = linear growth).

For each --files N it writes a data folder of N small JPEGs (--min-px to --max-px a side, in --classes class
folders; --distinct different images, written again and again, so that building 100,000 files takes seconds),
then runs the command a user runs, `torus-train data check --data DIR --split train --decode --workers W`, as
a subprocess on each folder, --rounds times with the sizes interleaved, and keeps the fastest run per size.
The sweep's own seconds (from the files/s the command prints) are reported beside the wall time (which also
holds the start-up and the folder listing), and the peak memory of the command's largest process.

    python scripts/bench/data_check.py --files 10000,30000,100000 --json data_check.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def encoded_images(count: int, low: int, high: int, seed: int = 0) -> list[bytes]:
    """``count`` distinct JPEGs, sides drawn in [low, high], smooth colour fields with noise (photo-like sizes
    for their pixel count: a few KB)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        h, w = (int(v) for v in rng.integers(low, high + 1, 2))
        x = np.mgrid[0:h, 0:w][1]
        base = rng.integers(0, 256, 3) + 60 * np.sin(x[..., None] / rng.uniform(3, 12) + rng.uniform(0, 6, 3))
        pixels = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=int(rng.integers(75, 96)))
        out.append(buf.getvalue())
    return out


def write_set(folder: Path, files: int, classes: int, images: list[bytes]) -> int:
    """train/CLASS/*.JPEG with ``files`` files cycling through ``images``; the bytes written."""
    written = 0
    for c in range(classes):
        (folder / "train" / f"c{c:04d}").mkdir(parents=True)
    for k in range(files):
        data = images[k % len(images)]
        with open(folder / "train" / f"c{k % classes:04d}" / f"{k:08d}.JPEG", "wb") as f:
            f.write(data)
        written += len(data)
    return written


def time_check(folder: Path, workers: int) -> dict:
    """Run `torus-train data check --decode` on ``folder``: wall seconds, the sweep's seconds (from the files/s
    it prints), files checked, and the peak memory of its largest process (itself or a pool worker: wait4)."""
    cmd = [sys.executable, "-m", "torus_train", "data", "check", "--data", str(folder), "--split", "train"]
    cmd += ["--decode", "--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        sys.exit(f"data check failed (exit {proc.returncode}): {stderr.strip().splitlines()[-1:]}")
    m = re.search(r"/train: \d+ classes, ([\d,]+) files, all train \([\d.]+ s, ([\d,]+) files/s", stdout)
    if not m:
        sys.exit(f"data check printed no split line: {stdout[-500:]}")
    checked, rate = (int(g.replace(",", "")) for g in m.groups())
    return {
        "seconds": wall,
        "sweep_seconds": checked / max(rate, 1),
        "checked": checked,
        "peak_rss_mb": usage.ru_maxrss / 1024,
    }


def measure(sets: dict[int, Path], workers: int, rounds: int) -> dict[int, dict]:
    """Per set size, the fastest of ``rounds`` runs (sizes interleaved, every other round in reverse order, so
    that a busy spell of the machine does not fall on one size only)."""
    best: dict[int, dict] = {}
    for r in range(rounds):
        for n in sorted(sets, reverse=bool(r % 2)):
            t = time_check(sets[n], workers)
            if t["checked"] != n:
                sys.exit(f"data check checked {t['checked']:,} files of {n:,}")
            if n not in best or t["seconds"] < best[n]["seconds"]:
                best[n] = t
    return best


def main(argv: list[str] | None = None) -> int:
    from torus_train.job.launch import usable_cpus

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", default="10000,30000,100000", help="Set sizes, comma-separated.")
    ap.add_argument("--classes", type=int, default=100, help="Class folders per set.")
    ap.add_argument("--distinct", type=int, default=300, help="Different images written in turn.")
    ap.add_argument("--min-px", type=int, default=32)
    ap.add_argument("--max-px", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0, help="data check --workers (0: every usable core).")
    ap.add_argument("--rounds", type=int, default=1, help="Runs per size; the fastest is reported.")
    ap.add_argument("--dir", default=None, help="Where to write the sets (default: a temporary folder).")
    ap.add_argument("--json", default=None, help="Write the results here.")
    a = ap.parse_args(argv)
    sizes = sorted(int(s) for s in a.files.split(","))
    if not sizes or sizes[0] < 1 or not 8 <= a.min_px <= a.max_px or min(a.distinct, a.classes, a.rounds) < 1:
        ap.error("--files must be positive, 8 <= --min-px <= --max-px, --distinct, --classes, --rounds at least 1")
    workers = a.workers or usable_cpus()
    images = encoded_images(a.distinct, a.min_px, a.max_px)
    mean_kb = sum(map(len, images)) / len(images) / 1e3
    print(f"data check --decode on {workers} process(es), best of {a.rounds} round(s); {a.distinct} distinct "
          f"JPEGs of {a.min_px}-{a.max_px} px ({mean_kb:.1f} KB each on average), {a.classes} classes")  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="data-check-bench-", dir=a.dir))
    try:
        sets, write_s = {}, {}
        for n in sizes:
            t0 = time.perf_counter()
            write_set(base / f"set-{n}", n, min(a.classes, n), images)
            sets[n], write_s[n] = base / f"set-{n}", time.perf_counter() - t0
        best = measure(sets, workers, a.rounds)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    columns = ("files", "write s", "check s", "sweep s", "img/s", "img/s/core", "us/file", "peak MB")
    print("  ".join(f"{c:>{w}}" for c, w in zip(columns, (9, 8, 8, 8, 8, 10, 8, 8), strict=True)))
    rows = []
    for n in sizes:
        t = best[n]
        rate = n / t["seconds"]
        row = {"files": n, "write_seconds": write_s[n], **t, "img_per_s": rate, "img_per_s_per_core": rate / workers}
        row["us_per_file"] = 1e6 * t["seconds"] / n
        row["sweep_us_per_file"] = 1e6 * t["sweep_seconds"] / n
        rows.append(row)
        print(f"{n:>9,}  {write_s[n]:>8.1f}  {t['seconds']:>8.1f}  {t['sweep_seconds']:>8.1f}  {rate:>8,.0f}  "
              f"{rate / workers:>10,.0f}  {row['us_per_file']:>8.0f}  {t['peak_rss_mb']:>8.0f}")  # fmt: skip
    big, small = rows[-1], rows[0]
    ratio = big["us_per_file"] / small["us_per_file"]
    sweep_ratio = big["sweep_us_per_file"] / small["sweep_us_per_file"]
    print(f"per-file cost, {big['files']:,} files / {small['files']:,} files: {ratio:.2f} for the command, "
          f"{sweep_ratio:.2f} for its sweep (1.00 = linear growth)")  # fmt: skip
    if a.json:
        doc = {"workers": workers, "rounds": a.rounds, "distinct": a.distinct, "px": [a.min_px, a.max_px]}
        doc.update(classes=a.classes, results=rows, ratio=ratio, sweep_ratio=sweep_ratio)
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
