#!/usr/bin/env python3
"""Count the host reads (device-to-host syncs) of a training step on CPU, for each precision path.

    python scripts/dev/check_step_syncs.py --json syncs.json [--steps 12] [--optimizer lars]

Runs the real loop of `torus-train run` (train/loop.py on a world of one, with the torus hook and its gloo
exchange) for --steps steps in each of fp32, bf16 (CPU autocast) and fp16-scaler (CPU autocast in fp16 with
torch.amp.GradScaler("cpu"): the code path a GPU's fp16 runs), and counts the reads of device values by the
training thread (aten::_local_scalar_dense and friends: tests/synccount.py, the CPU test hosts' counter; on a
CUDA machine the loop runs on its GPU and torch's sync debug mode counts, torus_train/check/syncs.py) in steps
that are not logging steps (the loop reads on purpose at a logging interval, a replica check or a checkpoint;
the first, warm-up step is not counted either). Writes

    {"steps": N, "syncs_per_step": {"fp32": a, "bf16": b, "fp16-scaler": c}}

and prints each read's place when one is found. Target: 0 for all three. Exit 0 when all are 0, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # torus_train from this checkout, installed or not


def small_spec(steps: int, optimizer: str, out: str, image_size: int = 32, batch: int = 8, arch: str = "resnet18"):
    """A resnet18 on synthetic data (32 px, batch 8), logging every 5 steps and a replica check every 10."""
    from torus_train.job.spec import load_spec, parse_override

    sets = [
        f"model.arch={arch}",
        "model.num_classes=10",
        "data.source=synthetic",
        f"data.image_size={image_size}",
        f"data.synthetic_samples={batch * (steps + 1)}",
        f"schedule.steps={steps}",
        f"schedule.stages=[{{until_epoch=1,global_batch={batch}}}]",
        "job.log_every=5",
        "job.check_every_steps=10",
        "checkpoint.every_steps=0",
        "checkpoint.every_epochs=0",
        "checkpoint.at_end=false",
        "eval.every_epochs=0",
        f"optimizer.name={optimizer}",
        f"job.out={out}",
        "data.num_threads=1",
        "job.max_nonfinite_steps=1000",
    ]  # fp16's loss scale starts high: its first steps may all be skipped
    return load_spec(None, [parse_override(s) for s in sets])


def count_all(steps: int, optimizer: str, precisions=None, **size) -> dict:
    """{precision: count_loop_syncs(...)} on a world of one (gloo on CPU)."""
    from torus_train.check.smallrun import PRECISIONS
    from torus_train.check.syncs import count_loop_syncs, counter_for
    from torus_train.job.topology import parse_grid
    from torus_train.ranks.distributed import init_distributed, shutdown

    with tempfile.TemporaryDirectory(prefix="step-syncs-") as out:
        spec = small_spec(steps, optimizer, out, **size)
        boot = init_distributed(parse_grid("1x1"), 60, environ={})
        counter = counter_for(boot.device)[0]
        try:
            return {p: count_loop_syncs(spec, boot, Path(out), p, counter) for p in precisions or PRECISIONS}
        finally:
            shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="where to write the result")
    ap.add_argument("--steps", type=int, default=12, help="steps per precision (default 12)")
    ap.add_argument("--optimizer", default="lars", choices=("lars", "sgd"))
    args = ap.parse_args(argv)
    if args.steps < 7:
        ap.error("--steps must be at least 7 (a warm-up step, logging steps at 5 and the last)")
    found = count_all(args.steps, args.optimizer)
    steps = min(r["steps"] for r in found.values())
    result = {"steps": steps, "syncs_per_step": {p: r["syncs"] / max(r["steps"], 1) for p, r in found.items()}}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    for p, r in found.items():
        print(
            f"{p:12s} {r['syncs'] / max(r['steps'], 1):.2f} host reads per step over {r['steps']} steps "
            f"(steps {', '.join(map(str, r['interval_steps']))} read on purpose, not counted)"
        )
        for where, n in sorted(r["where"].items(), key=lambda kv: -kv[1]):
            print(f"    {n:4d}  {where}")
    return 0 if all(v == 0 for v in result["syncs_per_step"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
