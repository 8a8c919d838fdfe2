#!/usr/bin/env python3
"""The planner against `bench allreduce` on the namespace cluster past two nodes (docs/cluster.md).

    python scripts/bench/cluster_vs_plan.py --nodes 4 --json OUT.json      # as root; takes the cluster lock itself
    python scripts/bench/cluster_vs_plan.py --markdown RUN.json ...         # the tables of docs/cluster.md

Under /tmp/torus-cluster.lock: `scripts/dev/cluster.sh up N` with TTC_RATE (default 1gbit: a tbf token bucket
on each node's outgoing link), 2 ranks per node, then for each backend (gloo; mpi = OpenMPI's coll/tuned, with
`--mca coll ^han` as docs/cluster.md found necessary across nodes):

1. calibration: `bench allreduce` on the first 2 nodes (grid 2x2) for flat, torus, hierarchical at the same
   sizes and CALIBRATION_SIZES; a Network of 2 ranks per node is fitted to those rows (both links' bandwidth
   and per-step latency and the reduction rate, least squares in log time: `fit`);
2. measurement: `bench allreduce` on all N nodes, grid 2xN (a node per row: the rows inside nodes, the columns
   across), same algorithms and sizes;
3. prediction: the planner's allreduce_cost with the fitted Network for every measured row, the CPU's part of
   it (per-step latencies, copies inside nodes, reductions) N/2 times slower: 2N ranks share the same 2 cores
   (`predict`); the shaped links keep their rate. `--calibration same-ranks` instead
   calibrates on the 2 nodes with N ranks each (as many ranks as the N-node run) and scales nothing
   (CALIBRATIONS). Backend `mpi-yield`: mpi with `--mca mpi_yield_when_idle 1`, calibration included.

`--from-raw DIR` makes the predictions of the current model from the bench rows a run recorded (the folder
it printed as `# raw bench rows:`, or docs/bench/*/raw-*), without a cluster.

Writes [{"nodes", "ranks_per_node", "algo", "backend", "bytes", "measured_s", "predicted_s", "fit"}]
(calibration rows with nodes 2, then the N-node rows) and prints the table with predicted/measured and
torus/flat at 2 and N nodes. The cluster is always torn down, also on failure.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from torus_train.job.topology import Grid  # noqa: E402
from torus_train.plan.cost import allreduce_cost  # noqa: E402
from torus_train.plan.networks import Link, Network  # noqa: E402

CLUSTER = ROOT / "scripts" / "dev" / "cluster.sh"
LOCK = "/tmp/torus-cluster.lock"
RANKS_PER_NODE = 2
MAX_NODES = 8
"""2 ranks per node on this machine's 2 cores: 8 nodes = 16 ranks is the most that still finishes."""
ALGOS = ("flat", "torus", "hierarchical")
CALIBRATION_SIZES = (64 << 10, 256 << 10, 4 << 20)
"""Sizes the 2-node calibration adds to the measured ones: small sizes pin the per-step latencies."""
BACKENDS = {
    "gloo": ("gloo", []),
    "mpi": ("mpi", ["--mca", "coll", "^han"]),
    "mpi-yield": ("mpi", ["--mca", "coll", "^han", "--mca", "mpi_yield_when_idle", "1"]),
}
"""Name -> (`bench --backend`, extra mpirun arguments). OpenMPI 5's coll/han makes the flat all-reduce across
nodes 17x slower; `mpi-yield`: the waiting ranks call sched_yield instead of spinning on their core."""


def fail(msg: str, code: int = 2) -> None:
    print(f"cluster_vs_plan.py: error: {msg}", file=sys.stderr)
    sys.exit(code)


def sizes_of(text: str) -> list[int]:
    try:
        out = [int(float(s) * 2**20) for s in text.split(",")]
    except ValueError:
        fail(f"--sizes-mib: {text!r} must be comma-separated MiB, e.g. 1,16,64")
    if not out or any(s < 1024 for s in out):
        fail(f"--sizes-mib: {text!r}: every size must be at least 1 KiB")
    return out


def cluster(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CLUSTER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


def sweeps(sizes: list[int]) -> list[tuple[int, int]]:
    """(first, last) of `bench allreduce -b first -e last -f 4` calls that cover `sizes`: one call when every
    size is the smallest times a power of 4 (each mpirun start costs seconds here), else one call per size."""
    lo, hi = min(sizes), max(sizes)
    chain = {lo * 4**k for k in range(40) if lo * 4**k <= hi}
    return [(lo, hi)] if set(sizes) <= chain else [(s, s) for s in sizes]


def bench(
    nodes: int, backend: str, sizes: list[int], out: Path, iters: int, algos=ALGOS, per_node: int = RANKS_PER_NODE
) -> list[dict]:
    """`bench allreduce` on nodes node1..nodeN, `per_node` ranks each, grid per_node x N: the rows of every size
    of `sizes`."""
    hosts = out.with_suffix(".hosts")
    hosts.write_text("".join(f"node{i} slots={per_node}\n" for i in range(1, nodes + 1)))
    rows = []
    for first, last in sweeps(sizes):
        j = out.with_name(f"{out.stem}-{first}-{last}.json")
        argv = [
            "exec",
            "node1",
            "mpirun",
            "-np",
            str(nodes * per_node),
            "--map-by",
            f"ppr:{per_node}:node",
            "--hostfile",
            str(hosts),
            "-x",
            "OMP_NUM_THREADS=1",
            "-x",
            "PATH",
            "-x",
            "PYTHONPATH",
            *BACKENDS[backend][1],
            sys.executable,
            "-m",
            "torus_train",
            "bench",
            "allreduce",
            "--grid",
            f"{per_node}x{nodes}",
            "--algo",
            ",".join(algos),
            "-b",
            str(first),
            "-e",
            str(last),
            "-f",
            "4",
            "-n",
            str(iters),
            "-w",
            "1",
            "-c",
            "0",
            "--backend",
            BACKENDS[backend][0],
            "--json",
            str(j),
        ]
        r = cluster(*argv, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(
                f"bench {backend} on {nodes} nodes at {first}..{last} B failed (exit {r.returncode}):"
                f" {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
            )
        rows += [x for x in json.loads(j.read_text()) if x["wrong"] == 0 and x["size_bytes"] in sizes]
    return rows


PARAMS = {
    "intra_gbps": (0.02, 10.0),
    "inter_gbps": (0.01, 1.0),
    "reduce_gbps": (0.05, 20.0),
    "intra_us": (1.0, 20_000.0),
    "inter_us": (1.0, 50_000.0),
}
"""What the fit chooses, each within (low, high) on a log scale: the two links' bandwidths and per-step latencies
(on 2 shared cores a step's latency is mostly the wait for a core, so it is fitted, not assumed) and the
reduction rate."""


def network(
    intra_gbps: float,
    inter_gbps: float,
    reduce_gbps: float,
    intra_us: float,
    inter_us: float,
    per_node: int = RANKS_PER_NODE,
) -> Network:
    """The namespace cluster as the planner sees it: `per_node` ranks per node, one shaped link out of each."""
    return Network(
        "namespace-cluster",
        per_node,
        Link(intra_gbps, intra_us),
        Link(inter_gbps, inter_us),
        1,
        reduce_gbytes_per_s=reduce_gbps,
    )


def predict(net: Network, nodes: int, algo: str, nbytes: int, share: float = 1.0) -> float:
    """The planner's all-reduce on grid (net's ranks per node) x nodes.

    `share`: how many times more ranks share the machine's 2 cores than in the calibration (`two-per-node`: N/2;
    1 otherwise). What a rank does on its CPU then takes `share` times longer: its per-step latency (the wait
    for a core), its copies inside a node (shared memory or loopback TCP) and its reductions; the shaped links
    between nodes (a tbf rate, not CPU) keep their bandwidth."""
    if share != 1.0:
        net = replace(
            net,
            intra=Link(net.intra.bandwidth_gbytes_per_s / share, net.intra.latency_us * share),
            inter=Link(net.inter.bandwidth_gbytes_per_s, net.inter.latency_us * share),
            reduce_gbytes_per_s=net.reduce_gbytes_per_s / share,
        )
    k = net.gpus_per_node
    return allreduce_cost(algo, Grid(k, nodes, k), net, nbytes).seconds


def fit(
    rows: list[dict], nodes: int, per_node: int = RANKS_PER_NODE, sweeps: int = 5, points: int = 41
) -> tuple[Network, float]:
    """The Network (per_node ranks per node) whose predictions are closest to rows measured on `nodes` nodes
    (least squares in log time), by coordinate descent over PARAMS on log grids of `points` values; returns it
    and the rms log error."""

    def err(p: dict) -> float:
        net = network(**p, per_node=per_node)
        return sum(math.log(predict(net, nodes, r["algo"], r["size_bytes"]) / (r["time_us"] * 1e-6)) ** 2 for r in rows)

    p = {k: math.sqrt(lo * hi) for k, (lo, hi) in PARAMS.items()}
    for _ in range(sweeps):
        for k, (lo, hi) in PARAMS.items():
            p[k] = min((lo * (hi / lo) ** (i / (points - 1)) for i in range(points)), key=lambda v: err({**p, k: v}))
    return network(**p, per_node=per_node), math.sqrt(err(p) / len(rows))


CALIBRATIONS = {
    "two-per-node": lambda nodes: (RANKS_PER_NODE, nodes / 2),
    "same-ranks": lambda nodes: (nodes * RANKS_PER_NODE // 2, 1.0),
}
"""How the 2-node calibration bench is run, for N measured nodes -> (its ranks per node, `predict`'s share: the
factor on the CPU's part of the fitted Network when predicting N nodes). `two-per-node` (default): 2 ranks per
node as in the run predicted, the CPU's part x N/2 (2N ranks time-share the same 2 cores). `same-ranks`: as many
ranks on the 2 nodes as the N-node run has (N per node), so the cores are shared as in the run predicted and no
oversubscription is extrapolated; but its grid (N x 2) sends little across nodes, so the inter-node link is
weakly pinned (fits at the bounds of PARAMS with one size or one iteration). Figures of both:
docs/cluster.md section 7."""


def row(
    x: dict, nodes: int, per_node: int, backend: str, calibration: str, predicted_s: float, net: Network, rms: float
) -> dict:
    return {
        "nodes": nodes,
        "ranks_per_node": per_node,
        "algo": x["algo"],
        "backend": backend,
        "bytes": x["size_bytes"],
        "measured_s": x["time_us"] * 1e-6,
        "predicted_s": predicted_s,
        "fit": {
            "calibration": calibration,
            "ranks_per_node": net.gpus_per_node,
            "intra_gbps": net.intra.bandwidth_gbytes_per_s,
            "inter_gbps": net.inter.bandwidth_gbytes_per_s,
            "reduce_gbps": net.reduce_gbytes_per_s,
            "intra_us": net.intra.latency_us,
            "inter_us": net.inter.latency_us,
            "rms_log_error": rms,
        },
    }


class LiveBench:
    """The bench rows of a run: `bench allreduce` on the namespace cluster (up while `run` uses it); each call's
    JSON is kept in a folder under /tmp, printed first, that --from-raw replays."""

    def __init__(self, args):
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="cvp-", dir="/tmp"))
        print(f"# raw bench rows: {self.tmp}", flush=True)

    def calibration(self, backend: str, sizes: list[int], per_node: int) -> list[dict]:
        a = self.args
        return bench(2, backend, sizes, self.tmp / f"{backend}-2x{per_node}", a.iters, a.algos, per_node)

    def measured(self, backend: str, nodes: int, sizes: list[int]) -> list[dict]:
        a = self.args
        return bench(nodes, backend, sizes, self.tmp / f"{backend}-{nodes}", a.iters, a.algos)


class RecordedBench:
    """The bench rows of a recorded run's raw folder (LiveBench's, or docs/bench/*/raw-*), for predictions of
    the current model from measurements already made: nothing is run."""

    def __init__(self, folder: Path, algos: list[str]):
        self.folder, self.algos = folder, algos

    def _rows(self, patterns: list[str], sizes: list[int], what: str) -> list[dict]:
        files = next((f for f in (sorted(self.folder.glob(p)) for p in patterns) if f), [])
        if not files:
            fail(
                f"--from-raw: {self.folder}: no bench rows of {what} ({' or '.join(patterns)}); pass --nodes, "
                "--backends and --calibration as the run had them"
            )
        return [
            x
            for f in files
            for x in json.loads(f.read_text())
            if x["wrong"] == 0 and x["size_bytes"] in sizes and x["algo"] in self.algos
        ]

    def calibration(self, backend: str, sizes: list[int], per_node: int) -> list[dict]:
        older = [f"{backend}-2-*.json"] if per_node == RANKS_PER_NODE else []  # before the name said 2xK
        return self._rows([f"{backend}-2x{per_node}-*.json", *older], sizes, f"{backend} on 2 nodes x {per_node} ranks")

    def measured(self, backend: str, nodes: int, sizes: list[int]) -> list[dict]:
        return self._rows([f"{backend}-{nodes}-*.json"], sizes, f"{backend} on {nodes} nodes")


def run(args, source) -> list[dict]:
    """Calibrate on 2 nodes and predict N for each backend, from `source`'s bench rows (LiveBench or
    RecordedBench)."""
    out_rows: list[dict] = []
    cal_k, share = CALIBRATIONS[args.calibration](args.nodes)
    for backend in args.backends:
        cal_sizes = sorted(set(args.sizes) | set(CALIBRATION_SIZES))
        cal_rows = source.calibration(backend, cal_sizes, cal_k)
        net, rms = fit(cal_rows, 2, cal_k)
        print(
            f"# {backend}: fitted on 2 nodes x {cal_k} ranks ({len(cal_rows)} rows, {args.calibration}): "
            f"intra {net.intra.bandwidth_gbytes_per_s:.3f} GB/s, "
            f"inter {net.inter.bandwidth_gbytes_per_s:.4f} GB/s, reduction {net.reduce_gbytes_per_s:.3f} GB/s, "
            f"step latency intra {net.intra.latency_us:.0f} us, inter {net.inter.latency_us:.0f} us; "
            f"rms log error {rms:.3f}; CPU work x {share:g} at {args.nodes} nodes",
            flush=True,
        )
        for x in cal_rows:
            if x["size_bytes"] in args.sizes:
                out_rows.append(
                    row(x, 2, cal_k, backend, args.calibration, predict(net, 2, x["algo"], x["size_bytes"]), net, rms)
                )
        if args.nodes == 2 and cal_k == RANKS_PER_NODE:
            continue
        two = replace(net, gpus_per_node=RANKS_PER_NODE)  # the links and latencies fitted, 2 ranks per node
        for x in source.measured(backend, args.nodes, args.sizes):
            out_rows.append(
                row(
                    x,
                    args.nodes,
                    RANKS_PER_NODE,
                    backend,
                    args.calibration,
                    predict(two, args.nodes, x["algo"], x["size_bytes"], share),
                    net,
                    rms,
                )
            )
    return out_rows


def on_cluster(args) -> list[dict]:
    """`run` on a namespace cluster of args.nodes nodes, brought up here and always torn down."""
    with open(LOCK, "a") as lock:
        if not args.no_lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the cluster exists once on the machine
        try:
            r = cluster("up", str(args.nodes), env={"TTC_RATE": args.rate, "TTC_SLURM": "0"}, timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"cluster.sh up {args.nodes}: {r.stderr.strip()}")
            return run(args, LiveBench(args))
        finally:
            cluster("down", timeout=300)


def report(rows: list[dict]) -> None:
    print(
        f"{'backend':>7} {'nodes':>5} {'algo':>12} {'MiB':>5} {'measured s':>11} {'predicted s':>12} {'pred/meas':>10}"
    )
    for r in rows:
        print(
            f"{r['backend']:>7} {r['nodes']:>5} {r['algo']:>12} {r['bytes'] / 2**20:>5g} {r['measured_s']:>11.4f} "
            f"{r['predicted_s']:>12.4f} {r['predicted_s'] / r['measured_s']:>10.2f}"
        )
    key = {(r["backend"], r["nodes"], r["algo"], r["bytes"]): r["measured_s"] for r in rows}
    for (b, n, a, s), t in sorted(key.items()):
        if a == "torus" and (b, n, "flat", s) in key:
            print(f"# {b} {n} nodes {s / 2**20:g} MiB: measured flat/torus {key[(b, n, 'flat', s)] / t:.2f}")


def markdown(paths: list[str]) -> str:
    """The tables of docs/cluster.md from recorded runs: predicted/measured per row and run, then measured
    flat/torus at 2 and N nodes per run."""
    runs = [(Path(p).stem, json.loads(Path(p).read_text())) for p in paths]
    keys = sorted(
        {(r["backend"], r["nodes"], r["algo"], r["bytes"]) for _, rows in runs for r in rows},
        key=lambda k: (k[0], k[1], ALGOS.index(k[2]), k[3]),
    )
    out = [
        "| backend | nodes | algo | MiB | " + " | ".join(f"{n}: measured s, pred/meas" for n, _ in runs) + " |",
        "|---|---|---|---|" + "---|" * len(runs),
    ]
    for k in keys:
        cells = []
        for _, rows in runs:
            r = next((r for r in rows if (r["backend"], r["nodes"], r["algo"], r["bytes"]) == k), None)
            cells.append(f"{r['measured_s']:.4f}, {r['predicted_s'] / r['measured_s']:.2f}" if r else "")
        out.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3] / 2**20:g} | " + " | ".join(cells) + " |")
    out += ["", "| run | backend | MiB | flat/torus at 2 nodes | flat/torus at N nodes (N) |", "|---|---|---|---|---|"]
    for name, rows in runs:
        t = {(r["backend"], r["nodes"], r["algo"], r["bytes"]): r["measured_s"] for r in rows}
        for b, s in sorted({(r["backend"], r["bytes"]) for r in rows}):
            n = max(r["nodes"] for r in rows)
            if not all((b, m, a, s) in t for m in (2, n) for a in ("flat", "torus")):
                continue
            ratio = [f"{t[(b, m, 'flat', s)] / t[(b, m, 'torus', s)]:.2f}" for m in (2, n)]
            out.append(f"| {name} | {b} | {s / 2**20:g} | {ratio[0]} | {ratio[1]} ({n}) |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--markdown"]:
        print(markdown(sys.argv[2:]), end="")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, required=True, help=f"nodes of 2 ranks, 2..{MAX_NODES}")
    ap.add_argument("--json", dest="json_path", required=True)
    ap.add_argument("--sizes-mib", default="1,16,64")
    ap.add_argument("--backends", default="gloo,mpi")
    ap.add_argument(
        "--algos",
        default=",".join(ALGOS),
        help="algorithms benched and predicted (of flat, torus, hierarchical; flat is the backend's own all-reduce)",
    )
    ap.add_argument("--rate", default="1gbit", help="tbf rate of each node's outgoing link")
    ap.add_argument(
        "--iters",
        type=int,
        default=20,
        help="timed iterations per point (as nccl-tests; `bench` cuts them to about 10 s a point for big messages)",
    )
    ap.add_argument(
        "--calibration",
        default="two-per-node",
        help="2-node calibration: same-ranks (as many ranks as the N-node run) or two-per-node",
    )
    ap.add_argument(
        "--from-raw",
        metavar="DIR",
        help="predict from the bench rows a run recorded in DIR (its "
        "`# raw bench rows:` folder) with the current model: no cluster, no bench",
    )
    ap.add_argument(
        "--no-lock",
        action="store_true",
        help=f"the caller already holds {LOCK} (e.g. `flock {LOCK} pytest tests/cluster`)",
    )
    args = ap.parse_args(argv)
    if not 2 <= args.nodes <= MAX_NODES:
        fail(
            f"--nodes: {args.nodes}: this machine hosts 2..{MAX_NODES} namespace nodes of {RANKS_PER_NODE} ranks "
            f"(2 CPU cores)"
        )
    args.backends = args.backends.split(",")
    bad = [b for b in args.backends if b not in BACKENDS]
    if bad:
        fail(f"--backends: unknown backend {bad[0]!r}; use {', '.join(BACKENDS)}")
    args.sizes = sizes_of(args.sizes_mib)
    args.algos = args.algos.split(",")
    bad = [a for a in args.algos if a not in ALGOS]
    if bad:
        fail(f"--algos: unknown algorithm {bad[0]!r}; use {', '.join(ALGOS)}")
    if args.calibration not in CALIBRATIONS:
        fail(f"--calibration: unknown calibration {args.calibration!r}; use {', '.join(CALIBRATIONS)}")
    if args.iters < 1:
        fail(f"--iters: {args.iters} must be >= 1")
    if args.from_raw is not None and not Path(args.from_raw).is_dir():
        fail(f"--from-raw: {args.from_raw}: no such folder (the `# raw bench rows:` folder a run printed)")
    if args.from_raw is None and os.geteuid() != 0:
        fail("needs root (network namespaces)")
    try:
        rows = run(args, RecordedBench(Path(args.from_raw), args.algos)) if args.from_raw else on_cluster(args)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"cluster_vs_plan.py: {e}", file=sys.stderr)
        return 1
    report(rows)
    Path(args.json_path).write_text(json.dumps(rows, indent=2) + "\n")
    print(f"# wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
