#!/usr/bin/env python3
"""Side by side: the backend's own all-reduce, the synchronous torus exchange and the asynchronous one, on `torus-train run`.

    python scripts/bench/bench_hook.py --grid 2x2 --rounds 3 --json hook-2x2.json
    python scripts/bench/bench_hook.py --grid 2x4 --gpus 8 --rounds 3 --json hook-2x4.json

Hooks (the names of the recorded results): ddp (comm.algo = ddp: the backend's all-reduce per bucket),
torus-sync (comm.algo = torus-sync: each bucket exchanged at its launch, no overlap), torus-async (comm.algo =
torus: the exchange runs on a background thread while backward goes on).
Each round runs every hook once, the order reversed every other round (so drift and noisy neighbours hurt all
alike). A run's speed is the median images/s of its metrics.jsonl intervals after the first (warm-up) one; a
hook's figure is the median over its rounds. Ratios: async / ddp and async / sync.
Then a timeline of one training step per hook (rank 0; ResNet at the same size and per-rank batch, the owned
buckets of comm/buckets.py at 25 MiB, serial): for each bucket when it was ready (its last gradient in), when
its exchange started and when it ended, relative to the start of the backward pass; written as JSON next to
--json and drawn as a PNG.

On one host an exchange is the cores copying bytes: with more ranks than cores there is no idle time for it to
hide in, so the three hooks can only tie. `--cluster HOSTFILE` runs every job on the namespace cluster of
scripts/dev/cluster.sh instead (root; bring it up first with its node links shaped, e.g.
`TTC_RATE=1gbit scripts/dev/cluster.sh up 2`), launched from node1 with `--launcher mpirun --hostfile HOSTFILE`:
rows inside a node (shared memory), the columns and the flat all-reduce's ring across the node links, whose bytes take wire
time as on a cluster, so the overlap of exchange and backward pass becomes measurable. The timeline's ranks
run there too, started by mpirun.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # torus_train from this checkout, installed or not

CLUSTER_SH = Path(__file__).resolve().parents[1] / "dev" / "cluster.sh"
HOOKS = {"ddp": "ddp", "torus-sync": "torus-sync", "torus-async": "torus"}
"""Benchmark name -> comm.algo."""


def run_once(hook: str, args, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torus_train",
        "run",
        "--gpus",
        str(args.gpus),
        "--grid",
        args.grid,
        "--data",
        "synthetic",
        "--model",
        args.model,
        "--image-size",
        str(args.image_size),
        "--steps",
        str(args.steps),
        "--out",
        str(out),
        "--set",
        f"comm.algo={HOOKS[hook]}",
        "--set",
        f"job.log_every={args.log_every}",
        "--set",
        "checkpoint.at_end=false",
        "--set",
        "checkpoint.every_epochs=0",
        "--set",
        "eval.every_epochs=0",
        "--set",
        f"schedule.stages=[{{until_epoch=4,global_batch={args.global_batch}}}]",
    ]
    if args.cluster:
        cmd = [str(CLUSTER_SH), "exec", "node1", *cmd, "--launcher", "mpirun", "--hostfile", args.cluster]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        sys.exit(f"bench_hook: {hook} run failed:\n{r.stderr[-2000:]}")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [m["images_per_second"] for m in lines if "images_per_second" in m][1:]
    summary = json.loads((out / "summary.json").read_text())
    return {
        "hook": hook,
        "images_per_s": statistics.median(rates),
        "intervals": len(rates),
        "wall_seconds": summary["wall_seconds"],
        "digests_agree": summary["param_digests_agree"],
    }


# --- timeline of one step (each rank runs this file with --worker) --------------------------------------
def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torchvision

    from torus_train.comm.groups import build_grid_groups
    from torus_train.comm.hooks import TorusHookState
    from torus_train.job.algorithms import ALGORITHMS
    from torus_train.job.topology import parse_grid

    env = os.environ  # started by run_local_ranks (RANK) or, on the cluster, by mpirun (OMPI_COMM_WORLD_RANK)
    rank = int(env.get("RANK", env.get("OMPI_COMM_WORLD_RANK", "-1")))
    world = int(env.get("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "0")))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{env.get('MASTER_ADDR', '127.0.0.1')}:{env['MASTER_PORT']}",
        rank=rank,
        world_size=world,
    )
    groups = build_grid_groups(parse_grid(args.grid), timeout=120)
    batch = max(1, args.global_batch // world)
    x = torch.randn(batch, 3, args.image_size, args.image_size, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(rank))
    steps = {}
    for hook in args.hooks.split(","):
        torch.manual_seed(0)
        mode = ALGORITHMS.get(HOOKS[hook])  # the state train/build.py's wrap_ddp makes for this comm.algo
        state = TorusHookState(
            groups, algo=mode.same_as or mode.name, asynchronous=mode.asynchronous, pipelined=False
        )  # serial: one ready, start and end per bucket (the two lanes have bench_pipeline.py)
        dp = _timed_buckets(torchvision.models.get_model(args.model, num_classes=1000), state)
        loss_fn = torch.nn.CrossEntropyLoss()
        for _step in range(args.timeline_step + 1):  # the first steps warm up
            dist.barrier()
            dp.timeline.clear()
            t_fwd = time.perf_counter()
            loss = loss_fn(dp(x), y)
            t0 = time.perf_counter()
            loss.backward()
            dp.finish()  # every bucket's exchange joined
            t_end = time.perf_counter()
            dp.zero_grad()
        steps[hook] = {
            "forward_s": t0 - t_fwd,
            "backward_and_exchange_s": t_end - t0,
            "buckets": [
                {
                    **{k: v for k, v in row.items() if k in ("bucket", "numel")},
                    **{k: row[k] - t0 for k in ("ready", "start", "end")},
                }
                for row in sorted(dp.timeline, key=lambda r: r["ready"])
            ],
        }
        dp.close()
    if rank == 0:
        Path(args.worker_out).write_text(
            json.dumps(
                {
                    "grid": args.grid,
                    "model": args.model,
                    "image_size": args.image_size,
                    "per_rank_batch": batch,
                    "step": args.timeline_step,
                    "hooks": steps,
                },
                indent=1,
            )
        )
    dist.destroy_process_group()


def _timed_buckets(model, state):
    """comm/buckets.py's BucketedModel (25 MiB buckets, as `run`) on CPU, recording for each bucket when it was
    ready (its last gradient in), when its exchange started and when it ended."""
    from torus_train.comm.buckets import BucketedModel
    from torus_train.comm.hooks import reduce_bucket

    class Timed(BucketedModel):
        timeline: list

        def _launch(self, b) -> None:
            row = {"bucket": b.index, "numel": b.flat.numel(), "ready": time.perf_counter()}

            def exchange():
                row["start"] = time.perf_counter()
                reduce_bucket(state, b.flat)
                row["end"] = time.perf_counter()
                self.timeline.append(row)

            if state.asynchronous:  # on the state's one background thread, in launch order, as BucketedModel
                b.futures.append(state.pool().submit(exchange))
            else:
                exchange()

    dp = Timed(model, state, 25)
    dp.timeline = []
    return dp


def timeline(args, path: Path) -> dict:
    from torus_train.ranks.bootstrap import free_port
    from torus_train.ranks.localrun import run_local_ranks

    x, y = map(int, args.grid.split("x"))
    world = x * y
    argv = [
        sys.executable,
        __file__,
        "--worker",
        "--worker-out",
        str(path),
        "--grid",
        args.grid,
        "--model",
        args.model,
        "--image-size",
        str(args.image_size),
        "--global-batch",
        str(args.global_batch),
        "--hooks",
        args.hooks,
        "--timeline-step",
        str(args.timeline_step),
    ]
    if args.cluster:  # the ranks where the runs had them: mpirun from node1, rendezvous on node1
        slots = int(re.search(r"slots=(\d+)", Path(args.cluster).read_text()).group(1))
        cmd = [
            str(CLUSTER_SH),
            "exec",
            "node1",
            "mpirun",
            "-np",
            str(world),
            "--map-by",
            f"ppr:{slots}:node",
            "--hostfile",
            args.cluster,
            "-x",
            "MASTER_ADDR=node1",
            "-x",
            "MASTER_PORT=29411",
            "-x",
            "OMP_NUM_THREADS=1",
            "-x",
            "PATH",
            *argv,
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        if r.returncode != 0:
            sys.exit(f"bench_hook: the timeline ranks failed on the cluster:\n{r.stderr[-2000:]}")
    else:
        port = str(free_port())
        envs = [
            {"RANK": str(r), "WORLD_SIZE": str(world), "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
            for r in range(world)
        ]
        run_local_ranks([argv] * world, envs, what="hook timeline")
    return json.loads(path.read_text())


def draw(tl: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hooks = list(tl["hooks"])
    fig, axes = plt.subplots(len(hooks), 1, figsize=(10, 1.2 + 1.3 * len(hooks)), sharex=True, squeeze=False)
    for ax, hook in zip(axes[:, 0], hooks, strict=True):
        h = tl["hooks"][hook]
        rows = h["buckets"]
        for i, b in enumerate(rows):
            ax.barh(i, b["end"] - b["start"], left=b["start"], height=0.6, color="tab:blue")
            ax.plot([b["ready"]], [i], "k|", markersize=12)
        ax.axvline(h["backward_and_exchange_s"], color="tab:red", lw=1)
        ax.set_yticks(
            range(len(rows)), [f"b{b['bucket']} ({b['numel'] * 4 / 2**20:.1f} MiB)" for b in rows], fontsize=7
        )
        ax.invert_yaxis()
        ax.set_title(f"{hook}: backward + exchange {h['backward_and_exchange_s'] * 1e3:.0f} ms", fontsize=9)
    axes[-1, 0].set_xlabel("seconds from the start of backward (|: bucket ready, bar: exchange, red: backward returns)")
    fig.suptitle(
        f"one step on {tl['grid']} (rank 0), {tl['model']} at {tl['image_size']} px, "
        f"{tl['per_rank_batch']} images per rank, link: {tl.get('link', '?')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _link(args) -> str:
    if args.cluster:
        r = subprocess.run(
            [str(CLUSTER_SH), "exec", "node1", "tc", "qdisc", "show", "dev", "eth0"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        rate = re.search(r"tbf .*?rate (\S+)", r.stdout)
        return f"namespace cluster ({args.cluster}), node links {rate.group(1) if rate else 'unshaped'}"
    return "loopback (one host)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hooks", default="ddp,torus-sync,torus-async", help=f"comma list of {', '.join(HOOKS)}")
    ap.add_argument("--gpus", type=int, default=0, help="ranks (default: X*Y of --grid)")
    ap.add_argument("--grid", default="2x2")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of runs (0: the timeline only)")
    ap.add_argument("--timeline-step", type=int, default=3, help="which step's timeline to keep (0-based)")
    ap.add_argument("--no-timeline", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument(
        "--json", default=None, help="write the results here (the timeline next to it: STEM-timeline.json and .png)"
    )
    ap.add_argument(
        "--cluster",
        default=None,
        metavar="HOSTFILE",
        help="run the jobs on the namespace cluster (scripts/dev/cluster.sh) with this hostfile",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.cluster and not Path(args.cluster).is_file():
        sys.exit(f"bench_hook: --cluster {args.cluster}: no such hostfile (lines 'node1 slots=2')")
    x, y = map(int, args.grid.split("x"))
    args.gpus = args.gpus or x * y
    hooks = args.hooks.split(",")
    unknown = [h for h in hooks if h not in HOOKS]
    if unknown:
        sys.exit(f"bench_hook: unknown hook {unknown[0]!r}; choose from {', '.join(HOOKS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            for hook in hooks if rnd % 2 == 0 else hooks[::-1]:
                row = run_once(hook, args, Path(tmp) / f"{hook}-{rnd}")
                row["round"] = rnd
                rows.append(row)
                print(
                    f"round {rnd} {hook:>12}: {row['images_per_s']:8.1f} img/s (median of {row['intervals']} "
                    f"intervals), wall {row['wall_seconds']:.1f} s",
                    flush=True,
                )
    link = _link(args)  # on the cluster: asks node1's tc once
    med = {h: statistics.median(r["images_per_s"] for r in rows if r["hook"] == h) for h in hooks if rows}
    ratios = {}
    if "torus-async" in med and "ddp" in med:
        ratios["async/ddp"] = med["torus-async"] / med["ddp"]
    if "torus-async" in med and "torus-sync" in med:
        ratios["async/sync"] = med["torus-async"] / med["torus-sync"]
    print(
        f"\n# {args.gpus} ranks on {args.grid}, {args.model} at {args.image_size} px, global batch "
        f"{args.global_batch}, {args.steps} steps, median of {args.rounds} alternating round(s), "
        f"link {link}"
    )
    print(f"{'hook':>12}  {'img/s':>9}  rounds")
    for h in med:
        print(f"{h:>12}  {med[h]:9.1f}  " + " ".join(f"{r['images_per_s']:.1f}" for r in rows if r["hook"] == h))
    for k, v in ratios.items():
        print(f"{k:>12}  {v:9.3f}")
    result = {
        "config": {k: v for k, v in vars(args).items() if not k.startswith("worker")},
        "link": link,
        "results": [
            {"hook": h, "images_per_s": med[h], "rounds": [r["images_per_s"] for r in rows if r["hook"] == h]}
            for h in med
        ],
        "ratios": ratios,
        "runs": rows,
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.json:  # written now and again with the timeline, so a failed timeline keeps the rounds
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if not args.no_timeline:
        stem = Path(args.json).with_suffix("") if args.json else Path(f"bench_hook-{args.grid}")
        tl_json, tl_png = Path(f"{stem}-timeline.json"), Path(f"{stem}-timeline.png")
        tl = {**timeline(args, tl_json), "link": link}
        tl_json.write_text(json.dumps(tl, indent=1))
        draw(tl, tl_png)
        result["timeline"] = {"json": str(tl_json), "png": str(tl_png)}
        for h, v in tl["hooks"].items():
            print(
                f"# timeline {h:>12}: backward + exchange {v['backward_and_exchange_s'] * 1e3:7.1f} ms, "
                f"{len(v['buckets'])} buckets"
            )
        print(f"# wrote {tl_json} and {tl_png}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"# wrote {args.json}")


if __name__ == "__main__":
    main()
