#!/usr/bin/env python3
"""Fit the CPU-host model (cpu_host.py) on one `bench allreduce --json` file and hold its prediction against
another grid's.

    python scripts/experiments/check_calibration.py BENCH_2x2.json BENCH_2x4.json [--algo torus] [--min-bytes 1M]
    python scripts/experiments/check_calibration.py A_2x2.json,B_2x2.json,C_2x2.json A_2x4.json,B_2x4.json,C_2x4.json

For each algorithm present in both files: alpha and the per-byte costs in and beyond the last-level cache are
fitted on the first file (cpu_host.host_calibrate, rows with wrong == 0), then the busbw of the
second file's grid is predicted at each of its sizes >= --min-bytes and printed next to the measured busbw with
the ratio. The second file is only compared with, never fitted. Exit status 0 when every ratio is within
--tolerance (default 30%), 1 otherwise. Several comma-separated files per side are merged by taking, for each
(algorithm, grid, size), the median time over the files: on a shared machine one run's noise can be as large
as the band being tested.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from cpu_host import HostCalibration, host_calibrate

from torus_train.bench.allreduce import parse_size
from torus_train.errors import UserError
from torus_train.job.topology import parse_grid
from torus_train.plan.calibrate import compare, read_benches


def check_algo(cal: HostCalibration, args: argparse.Namespace, check_rows: list, min_bytes: int) -> tuple[int, int]:
    """Print cal's fit, then each compared size of the check file; returns (sizes compared, sizes within)."""
    algo, total, inside = cal.algo, 0, 0
    bg = cal.background if args.check_background is None else args.check_background
    print(
        f"# {algo}: fit on {cal.grid} ({args.fit_file}, {len(cal.rows_used)} rows, {cal.rows_skipped} left out), "
        f"background {cal.background:g} (check file: {bg:g})"
    )
    for line in cal.describe():
        print(f"#   {line}")
    runs = {(str(parse_grid(r["grid"])), r["size_bytes"]): r.get("runs", 1) for r in check_rows if r["algo"] == algo}
    print(
        f"{'algo':>13} {'grid':>6} {'size (B)':>10} {'runs':>5} {'measured GB/s':>14} {'predicted GB/s':>15} "
        f"{'pred/meas':>10}"
    )
    for c in compare(replace(cal, background=bg), check_rows, min_bytes):  # predicted at the check's load
        ok = abs(c.ratio - 1) <= args.tolerance
        total += 1
        inside += ok
        print(
            f"{algo:>13} {c.grid:>6} {c.size_bytes:>10} {runs.get((c.grid, c.size_bytes), 1):>5} "
            f"{c.measured_busbw:>14.4f} {c.predicted_busbw:>15.4f} {c.ratio:>10.2f}{'' if ok else '  outside'}"
        )
    return total, inside


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("fit_file", help="bench JSON(s) to fit on, comma-separated (e.g. 2x2 runs)")
    ap.add_argument("check_file", help="bench JSON(s) of another grid to predict, comma-separated (e.g. 2x4 runs)")
    ap.add_argument("--algo", action="append", help="algorithm(s) to check (default: every one in both files)")
    ap.add_argument("--min-bytes", default="1M", help="smallest size compared (default 1M = 1 MiB)")
    ap.add_argument(
        "--cores", type=int, default=None, help="cores for the oversubscription term (default: this machine's)"
    )
    ap.add_argument(
        "--fit-background",
        type=float,
        default=0.0,
        help="runnable threads of other jobs during the fit file's bench (scripts/dev/measure_background.py; default 0)",
    )
    ap.add_argument(
        "--check-background",
        type=float,
        default=None,
        help="the same during the check file's bench (default: --fit-background)",
    )
    ap.add_argument(
        "--llc-mib",
        type=float,
        default=None,
        help="last-level cache in MiB the ranks' buffers share (default: this machine's, from /sys)",
    )
    ap.add_argument("--tolerance", type=float, default=0.30, help="allowed |predicted/measured - 1| (default 0.30)")
    args = ap.parse_args(argv)
    try:
        fit_rows, check_rows = read_benches(args.fit_file), read_benches(args.check_file)
        min_bytes = parse_size(args.min_bytes, "--min-bytes")
    except UserError as e:
        print(f"check_calibration: error: {e}", file=sys.stderr)
        return 2
    algos = args.algo or [a for a in dict.fromkeys(r["algo"] for r in fit_rows) if a in {r["algo"] for r in check_rows}]
    if not algos:
        print("check_calibration: error: no algorithm is present in both files", file=sys.stderr)
        return 2
    if args.llc_mib is not None and not args.llc_mib > 0:
        print(f"check_calibration: error: --llc-mib: {args.llc_mib:g} must be > 0", file=sys.stderr)
        return 2
    llc = None if args.llc_mib is None else int(args.llc_mib * 2**20)
    total = inside = 0
    for algo in algos:
        try:
            cal = host_calibrate(fit_rows, algo=algo, cores=args.cores, background=args.fit_background, llc_bytes=llc)
        except UserError as e:
            print(f"check_calibration: error: {e}", file=sys.stderr)
            return 2
        compared, within = check_algo(cal, args, check_rows, min_bytes)
        total, inside = total + compared, inside + within
    print(
        f"# summary: {inside} of {total} predictions within {args.tolerance * 100:.0f}% of the measured busbw "
        f"at >= {min_bytes} bytes"
    )
    return 0 if total and inside == total else 1


if __name__ == "__main__":
    sys.exit(main())
