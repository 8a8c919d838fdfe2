"""What the gradient noise scale costs: the default job (`torus-train run`, no spec) with the estimate on and
off, side by side in one run of this script, alternating (on, off, then off, on, ...) so that both see the same
machine load; steps per second and the on/off ratio (target >= 0.98: the estimate is on by default).

    python scripts/bench/bench_noise.py --rounds 3 --json F
    python scripts/bench/bench_noise.py --rounds 1 --run-args "--steps 40"    # shorter
    python scripts/bench/bench_noise.py --interleaved --rounds 20      # the step alone, on and off in turns
    python scripts/bench/bench_noise.py --compare-traces ON OFF   # two `plan rehearse --keep` folders

--interleaved times the default job's step itself (train/step.py's step_body: its model, optimizer, buckets
and torus exchange on its 2 gloo ranks, 2x1, random images at each stage's per-rank batch) with the estimate on
and off in turns of --steps steps inside one pair of processes, so that a load change on a shared machine hits
both alike; each turn's seconds per step, the median per side and the on/off ratio of steps per second (of
the medians, and the median of each round's ratio); and the estimate's own work per step timed alone on the
same buckets (the norms, the measure, the update), with the ratio it implies: off / (off + that work).

--compare-traces reads the collective traces of two rehearsals (`torus-train plan rehearse --keep DIR`, with
the estimate on and with `--set noise.enabled=false`) and prints, per trace file, whether both issue the same
collectives in the same order (op, group, root, dtype, captured or replayed, phase) and where their element
counts differ (the stats slot: one more element in the last bucket, fewer where padding absorbs it).

Each run trains in a fresh folder with evaluation and checkpoints off (they cost the same either way and
would blur the step rate). steps/s is the run's steps over its training seconds (summary.json's wall_seconds,
from the first data touch to the end); step s is the median of metrics.jsonl's step_time (seconds per step over
each logging interval, data wait included). The ratio is on/off of the medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--set", "eval.every_epochs=0", "--set", "checkpoint.every_epochs=0", "--set", "checkpoint.at_end=false"]


def one_run(on: bool, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        args = ["run", "--out", f"{tmp}/run", *QUIET, "--set", f"noise.enabled={'true' if on else 'false'}", *extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-m", "torus_train", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0:
            sys.exit(f"bench_noise: the run with the estimate {'on' if on else 'off'} failed:\n{done.stderr[-2000:]}")
        summary = json.loads(Path(tmp, "run", "summary.json").read_text())
        lines = [json.loads(x) for x in Path(tmp, "run", "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "step_time" in r]
    noise = (summary.get("noise_scale") or {}).get("end") or {}
    return {
        "noise": on,
        "steps": summary["steps"],
        "train_s": summary["wall_seconds"],
        "steps_per_s": round(summary["steps"] / summary["wall_seconds"], 4),
        "step_s_median": round(statistics.median(r["step_time"] for r in steps), 5),
        "noise_scale_end": noise.get("noise_scale"),
        "log_lines_with_noise_scale": sum("noise_scale" in r for r in steps),
    }


COLLECTIVE = ("op", "group", "root", "dtype", "captured", "replay", "phase")


def compare_traces(on: Path, off: Path) -> int:
    """Print, per trace file of both folders, the collectives compared; exit status 1 when any differ."""
    bad = 0
    names = sorted(p.name for p in on.glob("trace-*.json"))
    if not names or names != sorted(p.name for p in off.glob("trace-*.json")):
        sys.exit(f"bench_noise: {on} and {off} do not hold the same trace files")
    print("| trace | collectives on / off | same sequence | element counts that differ (on - off) |\n|---|---|---|---|")
    for name in names:
        a, b = (
            [e for e in json.loads((d / name).read_text())["events"] if e["kind"] == "collective"] for d in (on, off)
        )
        same = [tuple(e[k] for k in COLLECTIVE) for e in a] == [tuple(e[k] for k in COLLECTIVE) for e in b]
        diff = sorted({e["numel"] - f["numel"] for e, f in zip(a, b, strict=False) if e["numel"] != f["numel"]})
        bad += not same
        print(f"| {name} | {len(a)} / {len(b)} | {'yes' if same else 'NO'} | {diff or 'none'} |")
    return 1 if bad else 0


def interleaved_rank(rounds: int, steps: int, batches: list[int], out: str) -> None:
    """One rank of --interleaved (started by interleaved() with RANK, WORLD_SIZE, MASTER_PORT set)."""
    import time
    import types
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from torus_train.comm.buckets import BucketedModel
    from torus_train.comm.groups import build_grid_groups
    from torus_train.comm.hooks import TorusHookState
    from torus_train.job.spec import load_spec
    from torus_train.job.topology import parse_grid
    from torus_train.train.build import build_model, build_optimizer
    from torus_train.train.noise import NoiseScale
    from torus_train.train.step import set_lr, set_step, step_body

    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    init = f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=300))
    spec, cpu = load_spec(None), torch.device("cpu")
    torch.manual_seed(0)
    model = build_model(spec, cpu)
    dp = BucketedModel(
        model, TorusHookState(build_grid_groups(parse_grid("2x1")), "torus"), spec.comm.bucket_mb, stats=True
    )
    opt = build_optimizer(model, spec)
    opt.use_device_lr(cpu)
    noise, slot = NoiseScale(cpu, 2, spec.noise.average_epochs), dp.stats
    noise.set_epoch(10_000)
    rs = types.SimpleNamespace(
        ddp=dp,
        optimizer=opt,
        loss_fn=nn.CrossEntropyLoss(label_smoothing=spec.schedule.label_smoothing),
        amp_dtype=None,
        scaler=None,
        spec=spec,
        pos=types.SimpleNamespace(global_step=0),
        skip_counts=None,
        step_now=torch.zeros((), dtype=torch.int64),
        noise=None,
    )
    rows, n = [], 0
    for b in batches:
        g = torch.Generator().manual_seed(rank)  # each rank its own images: gradients that differ
        x, y = torch.randn(b, 3, 32, 32, generator=g), torch.randint(0, 10, (b,), generator=g)
        for r in range(rounds + 1):  # round 0 warms up
            for on in (True, False) if r % 2 else (False, True):
                rs.noise, dp.stats = (noise, slot) if on else (None, None)
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(steps):
                    n += 1
                    set_lr(opt, 0.01)
                    set_step(rs, n)
                    step_body(rs, x, y, 1)
                t = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slower rank's time is the step's
                if r:
                    rows.append({"per_rank_batch": b, "round": r, "noise": on, "step_s": t.item() / steps})
        rows.append({"per_rank_batch": b, "noise_work_s": noise_work(dp, noise, b)})
    if rank == 0:
        Path(out).write_text(json.dumps({"rows": rows, "noise_state": noise.read()}))
    dist.destroy_process_group()


def noise_work(dp, noise, batch: int, reps: int = 20) -> float:
    """Seconds of the estimate's own work in one step, timed alone on the step's buckets (median of reps): the
    squared norm of every bucket as it is launched, the measure after the exchange, the update."""
    import time

    import torch

    found, times = torch.zeros(()), []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        dp._reset()
        for b in dp.buckets:
            dp._add_norm(b)
        noise.update(noise.measure(dp, None), found, batch)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def interleaved(rounds: int, steps: int, batches: list[int]) -> dict:
    from torus_train.ranks.bootstrap import free_port
    from torus_train.ranks.localrun import run_local_ranks

    with tempfile.TemporaryDirectory() as tmp:
        out, port = f"{tmp}/rows.json", str(free_port())
        argv = [sys.executable, __file__, "--interleaved-rank", out, "--rounds", str(rounds), "--steps", str(steps)]
        argv += ["--batches", ",".join(map(str, batches))]
        envs = [{"RANK": str(r), "WORLD_SIZE": "2", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"} for r in (0, 1)]
        run_local_ranks([argv, argv], envs, what="bench_noise --interleaved")
        doc = json.loads(Path(out).read_text())
    table = {}
    print(
        "| per-rank batch | on: s per step (median) | off: s per step (median) | on/off steps per second (ratio of "
        "medians; median of the rounds' ratios) | the estimate's own work per step, timed alone | off / (off + it) |"
        "\n|---|---|---|---|---|---|"
    )
    for b in batches:
        mine = [r for r in doc["rows"] if r["per_rank_batch"] == b and "step_s" in r]
        med = {on: statistics.median(r["step_s"] for r in mine if r["noise"] is on) for on in (True, False)}
        pairs = statistics.median(
            next(o["step_s"] for o in mine if o["round"] == r["round"] and not o["noise"]) / r["step_s"]
            for r in mine
            if r["noise"]
        )
        work = next(r["noise_work_s"] for r in doc["rows"] if r["per_rank_batch"] == b and "noise_work_s" in r)
        implied = med[False] / (med[False] + work)
        table[b] = {"on_step_s": med[True], "off_step_s": med[False], "ratio": med[False] / med[True]}
        table[b] |= {"ratio_of_rounds": pairs, "noise_work_s": work, "implied_ratio": implied}
        print(
            f"| {b} | {med[True]:.4f} | {med[False]:.4f} | {med[False] / med[True]:.3f}; {pairs:.3f} | "
            f"{work * 1e3:.2f} ms | {implied:.4f} |"
        )
    return {"rows": doc["rows"], "by_batch": table, "noise_state_at_end": doc["noise_state"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating on/off pairs")
    ap.add_argument("--run-args", default="", help="more `torus-train run` arguments, quoted (e.g. '--steps 40')")
    ap.add_argument("--json", help="write the runs and the ratios here")
    ap.add_argument("--compare-traces", nargs=2, type=Path, metavar=("ON", "OFF"), help="two rehearsal folders")
    ap.add_argument("--interleaved", action="store_true", help="the step alone, on and off in turns (see above)")
    ap.add_argument("--steps", type=int, default=5, help="--interleaved: steps per turn")
    ap.add_argument("--batches", default="64,128,256", help="--interleaved: per-rank batches (the default's stages)")
    ap.add_argument("--interleaved-rank", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.compare_traces:
        return compare_traces(*a.compare_traces)
    batches = [int(b) for b in a.batches.split(",")]
    if a.interleaved_rank:
        interleaved_rank(a.rounds, a.steps, batches, a.interleaved_rank)
        return 0
    if a.interleaved:
        doc = interleaved(a.rounds, a.steps, batches)
        if a.json:
            Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    extra = shlex.split(a.run_args)
    runs = []
    for r in range(a.rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            runs.append({"round": r, **one_run(on, extra)})
            x = runs[-1]
            print(
                f"round {r} estimate {'on ' if on else 'off'}: {x['steps']} steps in {x['train_s']:.1f} s, "
                f"{x['steps_per_s']:.3f} steps/s, median step {x['step_s_median']:.4f} s",
                flush=True,
            )
    med = {
        on: {k: statistics.median(x[k] for x in runs if x["noise"] is on) for k in ("steps_per_s", "step_s_median")}
        for on in (True, False)
    }
    ratio = med[True]["steps_per_s"] / med[False]["steps_per_s"]
    step_ratio = med[False]["step_s_median"] / med[True]["step_s_median"]
    print("\n| estimate | steps/s (median) | median step s |\n|---|---|---|")
    for on in (True, False):
        print(f"| {'on' if on else 'off'} | {med[on]['steps_per_s']:.3f} | {med[on]['step_s_median']:.4f} |")
    print(f"\non/off steps per second: {ratio:.3f} (target >= 0.98); off/on median step time: {step_ratio:.3f}")
    if a.json:
        doc = {"runs": runs, "median": {"on": med[True], "off": med[False]}, "ratio_steps_per_s": round(ratio, 4)}
        Path(a.json).write_text(json.dumps({**doc, "ratio_step_time": round(step_ratio, 4)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
