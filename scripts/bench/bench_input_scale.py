#!/usr/bin/env python
"""Folder against packed input on the same photo-size JPEGs, cores and decode settings: images/s per rank, file
opens per image, and opens from the training thread.

    python scripts/bench/bench_input_scale.py --json OUT [--work DIR] [--per-class 50] [--rounds 3] [--batches 20]

Builds (or reuses) WORK/folder with scripts/photo_like_set.py (500x375 JPEGs, ImageNet-like sizes), its index,
and WORK/packed (torus-train data pack). The measurements run in child processes, each loader being one rank's
DALI loader (CPU decoding, all cores of this machine, --io-workers reader threads) of 224x224 training crops.

- images/s: one child holds both layouts' loaders and lets them take turns, in alternating order, for
  --rounds rounds (each turn: --warmup batches untimed, which drain what the idle loader had prefetched, then
  --batches timed), so both see the same load on a shared machine seconds apart; each layout's figure is
  the median of its rounds. No strace there.
- opens: one extra child per layout under ``strace -f -e trace=openat`` (DALI's C++ code and Python's both
  make openat calls, which Python's audit hooks would not all see). The child marks the timed window (after
  the warm-up batches: the pipeline is built, its libraries loaded) with two failing openat calls of a marker
  path; inside it, opens_per_image = every openat of any thread / images delivered, training_thread_opens =
  the openats whose thread id is the training thread's (the thread that calls the loader); opens of the kernel's
  pseudo-files under /proc and /sys (glibc reads /proc/sys/vm/overcommit_memory once, from whichever thread first
  frees memory) touch no storage and are not counted. The readers run
  up to a few batches ahead, so the window also holds the reads of batches delivered after it.

JSON: {"images": N, "results": [{"layout", "images_per_s", "opens_per_image", "training_thread_opens"}]};
the details (rounds, rates per round, counts) go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: torus_train and scripts/
MARK = "/nonexistent-torus-bench-mark"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare(work: Path, per_class: int) -> tuple[Path, Path, int]:
    """WORK/folder (photo-like JPEGs, indexed) and WORK/packed; reused when there with the same size."""
    folder, packed = work / "folder", work / "packed"
    want = 8 * per_class
    have = len(list((folder / "train").rglob("*.JPEG"))) if (folder / "train").is_dir() else 0
    if have != want:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(packed, ignore_errors=True)
        say(f"writing {want} photo-like JPEGs to {folder}")
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "photo_like_set.py"),
                "--out",
                str(folder),
                "--classes",
                "8",
                "--per-class",
                str(per_class),
            ],
            check=True,
        )
    from torus_train.data.index import ensure_index
    from torus_train.data.packed import is_packed
    from torus_train.data.packer import pack

    ensure_index(folder, log=say)
    if not is_packed(packed):
        pack(folder, packed, log=say)
    return folder, packed, want


def mark(what: str) -> None:
    """A failing openat of a marker path: delimits the timed window in the strace log."""
    try:
        os.open(f"{MARK}-{what}", os.O_RDONLY)
    except OSError:
        pass


def child(args) -> None:
    """One measurement: this process is one rank reading ``args.data``."""
    import threading

    ld = make(args, args.data)
    done, epoch, images = 0, 0, 0
    t0 = None
    while done < args.warmup + args.batches:
        ld.set_epoch(epoch)
        for _, y in ld:
            done += 1
            if done == args.warmup:  # the pipeline is built and running: the steady state starts here
                mark("start")
                t0 = time.perf_counter()
            elif done > args.warmup:
                images += len(y)
            if done >= args.warmup + args.batches:
                break
        epoch += 1
    seconds = time.perf_counter() - t0
    mark("end")
    ld.close()
    print(
        json.dumps(
            {"tid": threading.get_native_id(), "images": images, "seconds": seconds, "delivered": done * args.batch}
        )
    )


def make(args, root):
    from torus_train.data import make_loader

    return make_loader(
        "dali",
        str(root),
        "train",
        rank=0,
        world_size=1,
        batch_size=args.batch,
        image_size=224,
        num_classes=None,
        seed=0,
        channels_last=False,
        device="cpu",
        num_threads=args.threads,
        verify=False,
        io_workers=args.io_workers,
        prefetch=2,
    )


class Endless:
    """A loader's batches without end (epoch after epoch)."""

    def __init__(self, ld):
        self.ld, self.epoch, self.it = ld, 0, iter(ld)

    def next(self):
        while True:
            try:
                return next(self.it)
            except StopIteration:
                self.epoch += 1
                self.ld.set_epoch(self.epoch)
                self.it = iter(self.ld)


def rates_child(args) -> None:
    """Both layouts' loaders in this one process, taking turns: per round and layout, ``args.warmup`` batches
    untimed (the queues the idle loader filled are drained) then ``args.batches`` timed; the turns alternate
    their order, so both see the same load on a shared machine, seconds apart."""
    loaders = {"folder": Endless(make(args, args.folder)), "packed": Endless(make(args, args.packed))}
    per_round = {k: [] for k in loaders}
    for r in range(args.rounds):
        for name in list(loaders) if r % 2 == 0 else list(loaders)[::-1]:
            ld = loaders[name]
            for _ in range(args.warmup):
                ld.next()
            t0 = time.perf_counter()
            images = sum(len(ld.next()[1]) for _ in range(args.batches))
            per_round[name].append(images / (time.perf_counter() - t0))
            say(f"round {r + 1}/{args.rounds}: {name:<6} {per_round[name][-1]:7.1f} images/s")
    for ld in loaders.values():
        ld.ld.close()
    print(json.dumps(per_round))


def run_rates(folder: Path, packed: Path, args) -> dict[str, list[float]]:
    cmd = [sys.executable, __file__, "--rates-child", "--folder", str(folder), "--packed", str(packed)] + [
        f"--{k}={getattr(args, k.replace('-', '_'))}"
        for k in ("batch", "threads", "io-workers", "warmup", "batches", "rounds")
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"bench child failed ({out.returncode})")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_child(data: Path, args, trace: Path | None = None) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--data",
        str(data),
        "--batch",
        str(args.batch),
        "--threads",
        str(args.threads),
        "--io-workers",
        str(args.io_workers),
        "--warmup",
        str(args.warmup),
        "--batches",
        str(3 * args.batches),
    ]  # a longer window: the batches read ahead past its end weigh less
    if trace is not None:
        cmd = ["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(trace), *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if out.returncode != 0:
        raise SystemExit(f"bench child failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def count_opens(trace: Path, tid: int) -> tuple[int, int, int, int]:
    """(opens in the window, of them by the training thread, of them data files, opens before the window by
    the training thread) from an strace -f log (each line starts with the thread id)."""
    window = before_main = 0
    total = main = data = 0
    for line in trace.read_text(errors="replace").splitlines():
        m = re.match(r"(\d+)\s+openat\(", line)
        if not m:
            continue
        if MARK in line:
            window += 1
            continue
        if window == 0 and int(m.group(1)) == tid:
            before_main += 1
        if window != 1:
            continue
        if re.search(r'openat\([^,]*, "/(proc|sys)/', line):
            continue  # kernel pseudo-files (glibc's malloc reads /proc/sys/vm/overcommit_memory once): no storage
        total += 1
        main += int(m.group(1)) == tid
        data += bool(re.search(r'\.(JPEG|tar)"', line))
    return total, main, data, before_main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "torus-bench-input-scale"))
    ap.add_argument("--per-class", type=int, default=50, help="training JPEGs per class (8 classes)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4, help="untimed batches before each timed turn (at least 1)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="DALI decode threads (0: this process's cores)")
    ap.add_argument("--io-workers", type=int, default=4)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--rates-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--packed", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.threads = args.threads or len(os.sched_getaffinity(0))
    args.warmup = max(1, args.warmup)
    if args.child:
        return child(args)
    if args.rates_child:
        return rates_child(args)
    if not args.json:
        ap.error("--json OUT is required")
    if shutil.which("strace") is None:
        raise SystemExit("strace is needed to count the opens of DALI's threads (apt-get install strace)")
    folder, packed, n = prepare(Path(args.work), args.per_class)
    layouts = {"folder": folder, "packed": packed}
    rates = run_rates(folder, packed, args)
    results = []
    for name, root in layouts.items():
        trace = Path(args.work) / f"strace-{name}.log"
        m = run_child(root, args, trace)
        total, main_opens, data_opens, before = count_opens(trace, m["tid"])
        say(
            f"{name}: {m['images']} images timed; in the window {total} openat ({data_opens} of data files), "
            f"{main_opens} by the training thread; before it (loader start-up) {before} by that thread"
        )
        results.append(
            {
                "layout": name,
                "images_per_s": round(statistics.median(rates[name]), 1),
                "opens_per_image": round(total / m["images"], 4),
                "training_thread_opens": main_opens,
            }
        )
    ratio = results[1]["images_per_s"] / results[0]["images_per_s"]
    say("rounds (images/s): " + "; ".join(f"{k} {', '.join(f'{x:.1f}' for x in v)}" for k, v in rates.items()))
    pairs = [p / f for f, p in zip(rates["folder"], rates["packed"], strict=True)]
    say(
        f"packed / folder: {ratio:.2f}x (median rounds; per round {', '.join(f'{x:.2f}' for x in pairs)}); "
        f"{args.threads} decode thread(s), {args.io_workers} reader threads, batch {args.batch}, 224x224"
    )
    doc = {"images": n, "results": results}
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
