#!/usr/bin/env python3
"""Run a command and measure the background load it shared the CPU with.

    python scripts/dev/measure_background.py [--interval 0.2] -- torus-train bench allreduce --grid 2x2 ...

Every --interval seconds it reads the state of every thread on the machine (/proc/PID/task/TID/stat) and counts
the runnable ones (state R) that belong neither to the command's process tree nor to this script. At the end
it prints `background: MEAN runnable threads (median M, N samples)` and exits with the command's status.
The mean is the `background` term of the CPU-host model's oversubscription (scripts/experiments/cpu_host.py),
max(1, (ranks + background) / cores): `scripts/experiments/check_calibration.py --fit-background/--check-background`
and `scripts/experiments/compare_run.py --background/--run-background`. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _children(root: int) -> set[int]:
    """PIDs of root and all its descendants."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                parent[int(d)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def _runnable_outside(exclude: set[int]) -> int:
    count = 0
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in exclude:
            continue
        try:
            for tid in os.listdir(f"/proc/{d}/task"):
                with open(f"/proc/{d}/task/{tid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "R":
                        count += 1
        except (OSError, IndexError):
            continue
    return count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("--json", default=None, help="also write {'background': mean, ...} to this file")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to run after --")
    proc = subprocess.Popen(cmd)
    samples: list[int] = []
    me = os.getpid()
    try:
        while proc.poll() is None:
            samples.append(_runnable_outside(_children(proc.pid) | {me}))
            time.sleep(args.interval)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=30)
        raise
    rc = proc.wait()
    mean = statistics.mean(samples) if samples else 0.0
    med = statistics.median(samples) if samples else 0.0
    print(f"background: {mean:.2f} runnable threads outside the command (median {med:g}, {len(samples)} samples)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"background": mean, "median": med, "samples": len(samples), "command": cmd, "rc": rc}, f)
    return rc


if __name__ == "__main__":
    sys.exit(main())
