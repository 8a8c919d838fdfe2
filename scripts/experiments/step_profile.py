#!/usr/bin/env python3
"""One rank's training step measured on this CPU: the step profile that compare_run.py predicts a run from.

    python scripts/experiments/step_profile.py MODEL OUT.json [--image-size 64] [--batch 16] [--colocated R]

Forward + loss, backward (each module's share from post-accumulate-grad hooks) and the SGD step, as medians of
--repeats steps after 2; with one thread the clock is the thread's CPU time, which other jobs on the machine do
not stretch. --colocated R measures while R - 1 copies of the same step run in other processes (the ranks of a
run sharing memory bandwidth and cache). Writes cpu_host.StepProfile as JSON; its `modules` is also what
`torus-train plan --layer-profile` reads. Exit 0, or 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from cpu_host import StepProfile

from torus_train.errors import UserError

if TYPE_CHECKING:
    import torch


def measure_step_profile(
    model: str,
    image_size: int = 64,
    batch: int = 16,
    num_classes: int = 10,
    threads: int = 1,
    repeats: int = 5,
    warmup: int = 2,
) -> StepProfile:
    """One rank's step measured here with `threads` torch threads: forward + loss, backward, SGD step
    (momentum 0.9, weight decay 5e-5) as medians over `repeats` steps after `warmup`, and the backward per
    module (post-accumulate-grad hooks, on the same steps). With one thread the clock is the
    thread's CPU time (the backward pass runs on the calling thread on CPU), so other jobs on the machine do
    not stretch it; with more, wall time."""
    import torch
    import torchvision

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    clock = time.thread_time if threads == 1 else time.perf_counter
    m = getattr(torchvision.models, model)(num_classes=num_classes)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    names, stamps = _stamp_backward(m, clock)
    x = torch.randn(batch, 3, image_size, image_size)
    y = torch.randint(0, num_classes, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    steps = [_timed_step(m, opt, lambda: loss_fn(m(x), y), stamps, clock) for _ in range(warmup + repeats)][warmup:]
    fw, bw, op = [s[0] for s in steps], [s[1] for s in steps], [s[2] for s in steps]
    modules = {n: statistics.median(s[3].get(n, 0.0) for s in steps) for n in names}
    return StepProfile(
        model,
        image_size,
        batch,
        num_classes,
        threads,
        statistics.median(fw),
        statistics.median(bw),
        statistics.median(op),
        modules,
        cores=len(os.sched_getaffinity(0)),
        background=0.0,
        clock="cpu" if threads == 1 else "wall",
    )


def _stamp_backward(m: torch.nn.Module, clock: Callable[[], float]) -> tuple[list[str], dict[str, float]]:
    """(the names of m's modules that own parameters, a dict each of them stamps with clock() when its last
    gradient is accumulated in the backward pass)."""
    names = [n for n, mod in m.named_modules() if any(True for _ in mod.parameters(recurse=False))]
    mods = dict(m.named_modules())
    stamps: dict[str, float] = {}
    for n in names:
        for p in mods[n].parameters(recurse=False):
            p.register_post_accumulate_grad_hook(lambda _p, n=n: stamps.__setitem__(n, clock()))
    return names, stamps


def _timed_step(
    m: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loss_of: Callable[[], torch.Tensor],
    stamps: dict[str, float],
    clock: Callable[[], float],
) -> tuple[float, float, float, dict[str, float]]:
    """One training step: (forward + loss, backward, optimizer step, each module's share of the backward: the
    time since the previous stamp)."""
    opt.zero_grad(set_to_none=True)
    stamps.clear()
    t0 = clock()
    loss = loss_of()
    t1 = clock()
    loss.backward()
    t2 = clock()
    opt.step()
    t3 = clock()
    prev, per_module = t1, {}
    for n, t in sorted(stamps.items(), key=lambda kv: kv[1]):
        per_module[n], prev = t - prev, t
    return t1 - t0, t2 - t1, t3 - t2, per_module


def profile_to_json(p: StepProfile) -> dict:
    """The profile as JSON; its `modules` is also what `plan --layer-profile` reads."""
    return asdict(p)


def busy_loop(model: str, image_size: int, batch: int, num_classes: int) -> None:
    """Run one rank's step forever, one thread (a co-located copy for measure_step_profile's --colocated)."""
    import torch
    import torchvision

    torch.set_num_threads(1)
    m = getattr(torchvision.models, model)(num_classes=num_classes)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    x, y = torch.randn(batch, 3, image_size, image_size), torch.randint(0, num_classes, (batch,))
    first = True
    while True:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        if first:
            print("ready", flush=True)  # measure_colocated waits for this line from every copy
            first = False


def measure_colocated(
    model: str, image_size: int, batch: int, num_classes: int, colocated: int, repeats: int
) -> StepProfile:
    """measure_step_profile while colocated - 1 copies of the same step run in other processes (started here,
    stopped by their own process ids when the measurement ends)."""
    others = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--busy",
                model,
                "-",
                "--image-size",
                str(image_size),
                "--batch",
                str(batch),
                "--num-classes",
                str(num_classes),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(colocated - 1)
    ]
    try:
        for proc in others:  # every copy has done one step: all are in their loop
            if proc.stdout is None or proc.stdout.readline().strip() != "ready":  # stdout is a PIPE
                raise UserError("--colocated: a copy of the step did not start")
        prof = measure_step_profile(model, image_size, batch, num_classes, 1, repeats)
    finally:
        for proc in others:
            proc.terminate()
        for proc in others:
            proc.wait(timeout=30)
    prof.colocated = colocated
    return prof


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--colocated",
        type=int,
        default=1,
        help="measure while this many copies of the step run at once (the ranks of a run; 1 = alone)",
    )
    ap.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--background",
        type=float,
        default=0.0,
        help="other runnable threads during the measurement (only used for a wall-clock profile)",
    )
    a = ap.parse_args(argv)
    if a.busy:
        busy_loop(a.model, a.image_size, a.batch, a.num_classes)
    if a.colocated > 1 and a.threads != 1:
        ap.error("--colocated needs --threads 1")
    try:
        prof = (
            measure_colocated(a.model, a.image_size, a.batch, a.num_classes, a.colocated, a.repeats)
            if a.colocated > 1
            else measure_step_profile(a.model, a.image_size, a.batch, a.num_classes, a.threads, a.repeats)
        )
    except UserError as e:
        print(f"step_profile.py: error: {e}", file=sys.stderr)
        return 2
    prof.background = a.background
    Path(a.out).write_text(json.dumps(profile_to_json(prof), indent=1) + "\n")
    print(
        f"# {a.model} at {a.image_size} px, batch {a.batch}, {a.threads} thread(s), {prof.clock} time, "
        f"{prof.colocated} copies at once: forward {prof.forward_seconds * 1e3:.1f} ms, backward "
        f"{prof.backward_seconds * 1e3:.1f} ms, optimizer {prof.optimizer_seconds * 1e3:.1f} ms; wrote {a.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
