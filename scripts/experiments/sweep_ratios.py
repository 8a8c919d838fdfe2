"""busbw ratio of each algorithm to flat, per size, over several `bench allreduce --json` files of one grid.

    python scripts/experiments/sweep_ratios.py docs/bench/2026-12-02-mpi-native/mpi_2x2_{1,2,3}.json

Prints, per size and algorithm, the ratio in each file (each file's algorithms ran interleaved, so each ratio
is a side-by-side measurement), their minimum and their median.
"""

from __future__ import annotations

import argparse
import statistics

from torus_train.plan.calibrate import read_bench


def ratios(files: list[str]) -> dict:
    """{(algo, size): [flat time / algo time, one per file]}."""
    out: dict = {}
    for path in files:
        rows = read_bench(path)
        flat = {r["size_bytes"]: r["time_us"] for r in rows if r["algo"] == "flat"}
        for r in rows:
            if r["algo"] != "flat" and r["size_bytes"] in flat:
                out.setdefault((r["algo"], r["size_bytes"]), []).append(flat[r["size_bytes"]] / r["time_us"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--from-size", default=0, type=int, help="also print the minimum over sizes >= this (bytes)")
    args = ap.parse_args()
    table = ratios(args.files)
    algos = sorted({a for a, _ in table})
    print(f"# {len(args.files)} files; per file, min, median over files")
    for size in sorted({s for _, s in table}):
        cells = []
        for a in algos:
            v = table.get((a, size), [])
            cells.append(
                f"{a} " + " ".join(f"{x:.2f}" for x in v) + f" | min {min(v):.2f} med {statistics.median(v):.2f}"
            )
        print(f"{size:>10}  " + "   ".join(cells))
    for a in algos:
        big = [x for (b, s), v in table.items() if b == a and s >= args.from_size for x in v]
        med = [statistics.median(v) for (b, s), v in table.items() if b == a and s >= args.from_size]
        print(f"# {a} from {args.from_size} B: lowest single-file ratio {min(big):.2f}, lowest median {min(med):.2f}")


if __name__ == "__main__":
    main()
