"""`torus-train plan`: predict all-reduce and step time at any scale, choose a grid, calibrate, check groups.

No torch at module level: only --check-groups imports it (the fake backend needs it).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import click

from torus_train.commands.plan_verdict import algorithm_notes, print_buckets, print_verdict
from torus_train.errors import UserError

PLOT_COUNTS = (64, 128, 256, 512, 1024, 1088, 2048, 2176, 3456, 4096)
"""GPU counts on the plot's x axis: powers of two plus the paper's 1,088, 2,176 and 3,456."""


MAX_CHECKED_RANKS = 65_536
"""--simulate and --check-groups build every rank (or every group) in this process; beyond this they take
minutes and gigabytes."""


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f}"


@click.command("plan")
@click.option("--gpus", type=click.IntRange(min=1), default=None, help="World size N to plan for.")
@click.option("--grid", "grid_text", default=None, metavar="XxY",
              help="Grid to evaluate (X ranks per row); default: the fastest predicted grid for N.")
@click.option("--network", default="abci-v100", show_default=True, metavar="NAME|FILE",
              help="Network preset (abci-v100, dgx-h100, goyal-p100-50gbe, jia-p40-100gbe) or a TOML file.")
@click.option("--model", default="resnet50", show_default=True, help="Model whose gradients are exchanged.")
@click.option("--per-gpu-batch", type=int, default=32, show_default=True, help="Images per GPU per step.")
@click.option("--grad-dtype", type=click.Choice(["fp16", "bf16", "fp32"]), default="fp16", show_default=True,
              help="Dtype the gradients are exchanged in.")
@click.option("--images-per-second", type=float, default=None,
              help="Single-GPU training throughput; default: the network preset's figure for the model.")
@click.option("--overlap", type=float, default=None,
              help="OVERRIDE: fraction of the backward pass that hides communication, 0..1 (the gradient as one "
                   "all-reduce); default: derived from the bucket timeline of DDP's buckets.")
@click.option("--step-overhead", type=float, default=None,
              help="Fraction of the single-GPU compute every step also pays unhidden (stragglers, waits, data "
                   "loading); default: the model's one fitted constant (printed with the plan; docs/plan.md); 0 "
                   "removes it.")
@click.option("--placement", type=click.Choice(["rows", "columns"]), default="rows", show_default=True,
              help="How ranks fill nodes: rows (a node's GPUs sit in one row, as in the paper) or columns.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write the plan as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="PNG of predicted all-reduce time against GPU count (64..4096) per algorithm.")
@click.option("--bucket-cap-mb", type=float, default=None,
              help="DDP's bucket_cap_mb for the bucket timeline (MiB of fp32 parameters; the first bucket 1 MiB) "
                   "[default: 25 with --grid; without --grid, chosen with the grid by the predicted step].")
@click.option("--layer-profile", "profile_path", type=click.Path(dir_okay=False), default=None, metavar="FILE.json",
              help="Backward seconds per module ({module: seconds}, from `python -m torus_train.plan.timeline "
                   "MODEL OUT.json`) to share the backward pass by, instead of layer FLOPs.")
@click.option("--png", "png_path", type=click.Path(dir_okay=False), default=None,
              help="PNG of one step's bucket timeline: backward per bucket, each bucket's exchange per algorithm.")
@click.option("--calibrate", "bench_path", type=click.Path(dir_okay=False), default=None, metavar="BENCH.json",
              help="Fit alpha and beta of this machine from `bench allreduce --json` rows and predict --grid; "
                   "several comma-separated files: the median time per point.")
@click.option("--calibrate-algo", default=None, help="Which algorithm's rows to fit [default: torus if present].")
@click.option("--cores", type=click.IntRange(min=1), default=None,
              help="CPU cores for the oversubscription term of --calibrate [default: this machine's].")
@click.option("--background", type=float, default=0.0, show_default=True,
              help="--calibrate: other runnable processes that shared the cores during the bench (e.g. its load "
                   "average without the bench).")
@click.option("--llc-mib", type=float, default=None,
              help="--calibrate: last-level cache size in MiB that the ranks' buffers share [default: this "
                   "machine's, from /sys].")
@click.option("--compare", "compare_path", type=click.Path(dir_okay=False), default=None, metavar="BENCH.json",
              help="--calibrate: a bench file (or comma-separated files) of another grid; print its measured "
                   "busbw beside the predicted one.")
@click.option("--compare-run", "run_out", type=click.Path(file_okay=False), default=None, metavar="OUT",
              help="A finished CPU `torus-train run --out OUT`: its measured step time (OUT/metrics.jsonl) against "
                   "the prediction from --calibrate BENCH.json and --layer-profile PROF.json (a step profile).")
@click.option("--run-background", type=float, default=None,
              help="--compare-run: other runnable threads while the run ran [default: --background].")
@click.option("--check-groups", is_flag=True,
              help="Build every row and column process group of the grid on torch's one-process fake backend.")
@click.option("--simulate", is_flag=True,
              help="Run the torus's exact data movement on N virtual ranks with ragged integer tensors.")
def plan(gpus, grid_text, network, model, per_gpu_batch, grad_dtype, images_per_second, overlap, step_overhead,
         placement, json_path, plot_path, bench_path, calibrate_algo, cores, background, llc_mib, compare_path,
         check_groups, simulate, bucket_cap_mb, png_path, profile_path, run_out, run_background) -> None:
    """Predict all-reduce time, step time and scaling efficiency per algorithm; choose a grid for N GPUs.

    \b
    Examples:
      torus-train plan --gpus 1088 --network abci-v100 --per-gpu-batch 32
      torus-train plan --gpus 2176 --grid 32x68 --simulate --check-groups
      torus-train plan --calibrate bench_2x2.json --grid 2x4
      torus-train plan --calibrate bench_2x2.json --compare bench_2x4.json
      torus-train plan --compare-run runs/x --calibrate bench_2x2.json --layer-profile step.json
    """
    from torus_train.job.topology import parse_grid
    from torus_train.plan.cost import STEP_OVERHEAD
    from torus_train.plan.networks import load_network
    from torus_train.plan.search import make_plan

    from torus_train.job.topology import check_world_size

    _check_numbers(json_path, plot_path, images_per_second, overlap, background, llc_mib)
    _check_step_overhead(step_overhead, overlap)
    if gpus is not None:
        if gpus < 1:
            raise UserError(f"--gpus: {gpus} must be at least 1")
        check_world_size(gpus, "--gpus")
    if run_out is not None:
        from torus_train.errors import check_number

        check_number(run_background, "--run-background", 0.0, low_ok=True)
        _compare_run(run_out, bench_path, profile_path, cores, background,
                     background if run_background is None else run_background, llc_mib, json_path)
        return
    if bench_path is not None:
        _calibrate(bench_path, grid_text, calibrate_algo, cores, background, llc_mib, compare_path, json_path)
        return
    if gpus is None:
        if grid_text is None:
            raise UserError("--gpus is required (or --grid XxY, or --calibrate BENCH.json)")
        gpus = parse_grid(grid_text).size
    net = load_network(network)
    grid = parse_grid(grid_text, net.gpus_per_node) if grid_text else None
    _check_plan_args(gpus, grid, per_gpu_batch, overlap, bucket_cap_mb, simulate or check_groups, plot_path, png_path)
    profile = _read_profile(profile_path) if profile_path else None
    p = make_plan(gpus, net, model, per_gpu_batch, grid, grad_dtype, images_per_second, overlap, placement,
                  None if bucket_cap_mb is None else int(bucket_cap_mb * 2**20), profile,
                  STEP_OVERHEAD if step_overhead is None else step_overhead)
    _print_plan(p)
    out = p.to_json()
    if p.overlap is None:
        out["bucket_caps"] = _bucket_caps(p)
    out["verdict"] = print_verdict(p)
    if simulate:
        out["simulation"] = _simulate(parse_grid(p.grid))
    if check_groups:
        out["check_groups"] = _check_groups(parse_grid(p.grid, net.gpus_per_node))
    if plot_path is not None:
        _plot(net, p.gradient_bytes, plot_path, f"{model} {grad_dtype} gradients ({_mb(p.gradient_bytes)} MB)",
              placement, gpus)
        click.echo(f"# wrote plot {plot_path}")
    if png_path is not None:
        _plot_timeline(p, png_path)
        click.echo(f"# wrote timeline {png_path}")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
        click.echo(f"# wrote {json_path}")


def _check_numbers(json_path, plot_path, images_per_second, overlap, background, llc_mib) -> None:
    from torus_train.errors import check_number, check_output_file

    for path, flag in ((json_path, "--json"), (plot_path, "--plot")):
        if path is not None:
            check_output_file(path, flag)
    check_number(images_per_second, "--images-per-second")
    check_number(overlap, "--overlap", 0.0, low_ok=True, high=1.0)
    check_number(background, "--background", 0.0, low_ok=True)
    check_number(llc_mib, "--llc-mib")


def _check_step_overhead(step_overhead, overlap) -> None:
    from torus_train.errors import check_number

    check_number(step_overhead, "--step-overhead", 0.0, low_ok=True)
    if step_overhead is not None and overlap is not None:
        raise UserError("--step-overhead belongs to the bucket timeline, which --overlap replaces; leave one out")


def _check_plan_args(gpus, grid, per_gpu_batch, overlap, bucket_cap_mb, virtual_ranks, plot_path, png_path) -> None:
    if per_gpu_batch < 1:
        raise UserError(f"--per-gpu-batch: {per_gpu_batch} must be a positive integer")
    if overlap is not None and not 0.0 <= overlap <= 1.0:
        raise UserError(f"--overlap: {overlap} must be between 0 and 1")
    if plot_path is not None:
        _require_matplotlib()
    if virtual_ranks and (grid.size if grid else gpus) > MAX_CHECKED_RANKS:
        raise UserError(f"--simulate and --check-groups run on at most {MAX_CHECKED_RANKS:,} virtual ranks, not "
                        f"{grid.size if grid else gpus:,}")
    from torus_train.errors import check_number

    check_number(bucket_cap_mb, "--bucket-cap-mb", 0.0, high=MAX_BUCKET_MIB)
    if png_path is not None:
        if overlap is not None:
            raise UserError("--png draws the bucket timeline, which --overlap replaces; leave one out")
        _require_matplotlib()


MAX_BUCKET_MIB = 1 << 20
"""--bucket-cap-mb: 1 TiB, far above any model's gradients (one bucket then holds them all)."""


def _bucket_caps(p) -> list:
    """The torus step at several DDP bucket caps on the timeline; prints the fastest."""
    from torus_train.plan.search import bucket_sweep

    caps = bucket_sweep(p)
    best = min(caps, key=lambda c: c["step_seconds"])
    here = p.algorithms["torus"]
    click.echo(f"# bucket cap: {p.bucket_cap_bytes / 2**20:g} MiB gives the torus {here.step_seconds * 1e3:.2f} ms "
               f"per step; of {', '.join(str(c['cap_mb']) for c in caps)} MiB the fastest is "
               f"{best['cap_mb']:g} MiB ({best['buckets']} buckets, {best['step_seconds'] * 1e3:.2f} ms, "
               f"{best['scaling_efficiency'] * 100:.2f}%): smaller buckets start exchanging earlier, larger ones "
               f"pay fewer latency terms")
    return caps


def _read_profile(path: str) -> dict:
    """--layer-profile: {module name: backward seconds} from a JSON file (or a step profile's modules)."""
    from torus_train.plan.host import check_module_seconds
    from torus_train.userfiles import read_json

    where = f"--layer-profile: {path}"
    d = read_json(path, where)
    if isinstance(d, dict) and isinstance(d.get("modules"), dict):   # a step profile (torus_train.plan.host)
        return check_module_seconds(d["modules"], f"{where}: modules")
    return check_module_seconds(d, where)


def _plot_timeline(p, path: str) -> None:
    """One step from the end of the forward pass: the backward pass split at the buckets' ready times, and each
    algorithm's exchanges (one bar per bucket, queued) on its own row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = list(p.algorithms)
    first = p.algorithms[algos[0]].timeline
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * (len(algos) + 1)))
    prev = 0.0
    for b in first["buckets"]:
        ax.barh(0, (b["ready_seconds"] - prev) * 1e3, left=prev * 1e3, color=colors(b["index"] % 10),
                edgecolor="black", height=0.6)
        prev = b["ready_seconds"]
    for row, algo in enumerate(algos, start=1):
        t = p.algorithms[algo].timeline
        for b in t["buckets"]:
            ax.barh(row, b["allreduce_seconds"] * 1e3, left=b["start_seconds"] * 1e3,
                    color=colors(b["index"] % 10), edgecolor="black", height=0.6)
        extra = f" + {t['overhead_seconds'] * 1e3:.2f} ms overhead" if t["overhead_seconds"] else ""
        ax.text(t["buckets"][-1]["end_seconds"] * 1e3, row, f"  exposed {t['exposed_seconds'] * 1e3:.2f} ms{extra}, "
                f"eff. {t['scaling_efficiency'] * 100:.1f}%", va="center", fontsize=8)
    ax.axvline(first["backward_seconds"] * 1e3, color="grey", linestyle=":")
    ax.set_yticks(range(len(algos) + 1))
    ax.set_yticklabels(["backward (per bucket)"] + [f"{a} all-reduce" for a in algos])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the start of the backward pass (dotted: its end)")
    ax.set_title(f"{p.network.name}, {p.gpus} GPUs, grid {p.grid}: {p.model} {p.gradient_dtype}, "
                 f"{p.per_gpu_batch}/GPU, {len(first['buckets'])} DDP buckets")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _print_plan(p) -> None:
    """The plan as printed: its inputs with their sources, one line per algorithm, the torus's summary."""
    from torus_train.plan.cost import BACKWARD_FRACTION, MODELS, step_cost
    from torus_train.plan.nccl import NCCL_SOURCE

    m, net = MODELS[p.model], p.network
    click.echo(f"# torus-train plan: {p.gpus} GPUs, {p.model} ({m.parameters:,} parameters, {p.gradient_dtype} "
               f"gradients = {_mb(p.gradient_bytes)} MB), {p.per_gpu_batch} images per GPU")
    for line in net.describe():
        click.echo(f"# {line}")
    how = (f"overlap OVERRIDE (--overlap) {p.overlap:g} of the backward pass hides communication"
           if p.overlap is not None else
           f"overlap derived from the bucket timeline: DDP buckets (1 MiB first, then "
           f"{p.bucket_cap_bytes / 2**20:g} MiB, reverse parameter order), backward shared by "
           f"{'layer FLOPs' if p.backward_share == 'forward FLOPs' else 'the measured --layer-profile'}, each "
           f"bucket all-reduced in turn")
    click.echo(f"# compute per step: {p.per_gpu_batch} / {p.images_per_second:g} img/s = "
               f"{p.compute_seconds * 1e3:.2f} ms; backward {BACKWARD_FRACTION:.2f} of it; {how}")
    if p.step_overhead is not None:
        what = ("--step-overhead" if p.step_overhead_source == "--step-overhead"
                else "the model's one FITTED constant (docs/plan.md)")
        click.echo(f"# every step also pays {p.step_overhead:g} x compute = {p.overhead_seconds * 1e3:.2f} ms "
                   f"unhidden: {what}")
    click.echo(f"# grid {p.grid}: {p.grid_why}; ranks fill nodes by {p.placement}")
    _print_candidates(p.candidates)
    click.echo("#")
    head = (f"{'algorithm':>13} {'steps':>6} {'MB across nodes':>16} {'all-reduce ms':>14} {'busbw GB/s':>11} "
            f"{'exposed ms':>11} {'overlap':>8} {'step ms':>9} {'efficiency':>11}")
    click.echo(head)
    for a in p.algorithms.values():
        click.echo(f"{a.algo:>13} {a.steps:>6} {_mb(a.bytes_across_nodes):>16} {a.allreduce_seconds * 1e3:>14.3f} "
                   f"{a.busbw_gbytes_per_s:>11.2f} {a.exposed_seconds * 1e3:>11.3f} "
                   f"{_overlap_text(a, p):>8} {a.step_seconds * 1e3:>9.2f} {a.scaling_efficiency * 100:>10.2f}%")
    for line in algorithm_notes(p):
        click.echo(f"# {line}")
    print_buckets(p)
    t = p.algorithms["torus"]
    if t.timeline is not None:
        for b in t.timeline["buckets"]:
            click.echo(f"# torus bucket {b['index']}: {b['parameter_count']} tensors ({b['last_parameter']} .. "
                       f"{b['first_parameter']}), {_mb(b['nbytes'])} MB, ready {b['ready_seconds'] * 1e3:.2f} ms, "
                       f"exchange {b['start_seconds'] * 1e3:.2f}..{b['end_seconds'] * 1e3:.2f} ms")
    click.echo(f"# summary: torus on {p.grid} predicts {t.allreduce_seconds * 1e3:.3f} ms per all-reduce, "
               f"{t.step_seconds * 1e3:.2f} ms per step, scaling efficiency {t.scaling_efficiency * 100:.2f}% "
               f"(MB across nodes: the busiest rank's bytes sent over NICs per all-reduce)")
    lo, hi = (p.compute_seconds / (step_cost(p.compute_seconds, t.allreduce_seconds, o).step_seconds
                                   + p.overhead_seconds) for o in (0.0, 1.0))
    click.echo(f"# torus efficiency with no overlap {lo * 100:.2f}%, with the whole backward pass overlapped "
               f"{hi * 100:.2f}%")
    click.echo("# sources:" + ("" if net.sources else " none given"))
    for s in net.sources:
        click.echo(f"#   - {s}")
    click.echo(f"#   - {NCCL_SOURCE}")


CANDIDATES_SHOWN = 8
"""Rows of the (grid, bucket cap) comparison that plan prints (JSON holds them all)."""


def _print_candidates(cands: list[dict]) -> None:
    """The (grid, bucket cap) pairs the choice compared, best first."""
    if not cands:
        return
    click.echo(f"# {'grid':>9} {'cap MiB':>8} {'buckets':>8} {'fused all-reduce ms':>20} {'exposed ms':>11} "
               f"{'step ms':>9} {'efficiency':>11}")
    for c in cands[:CANDIDATES_SHOWN]:
        click.echo(f"# {c['grid']:>9} {c['cap_mb']:>8g} {c['buckets']:>8} {c['allreduce_seconds'] * 1e3:>20.3f} "
                   f"{c['exposed_seconds'] * 1e3:>11.3f} {c['step_seconds'] * 1e3:>9.2f} "
                   f"{c['scaling_efficiency'] * 100:>10.2f}%")
    if len(cands) > CANDIDATES_SHOWN:
        click.echo(f"# ... {len(cands) - CANDIDATES_SHOWN} more in --json (candidates)")


def _overlap_text(a, p) -> str:
    """The overlap column: derived from the timeline, or the override marked with '*'."""
    return f"{a.derived_overlap:.3f}" if a.derived_overlap is not None else f"{p.overlap:g}*"


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise UserError("--plot needs matplotlib: pip install 'torus-train[plot]'") from None


def _plot(net, nbytes: int, path: str, what: str, placement: str, gpus: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from torus_train.plan.search import sweep

    curves = sweep(net, nbytes, PLOT_COUNTS, placement)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for algo, points in curves.items():
        ax.plot([n for n, _ in points], [s * 1e3 for _, s in points], marker="o", label=algo)
    ax.axvline(gpus, color="grey", linestyle=":", label=f"--gpus {gpus}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [n for n in PLOT_COUNTS if n & (n - 1) == 0]
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(n) for n in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPUs (torus on its fastest grid; hierarchical with one leader per node)")
    ax.set_ylabel("predicted all-reduce time (ms)")
    ax.set_title(f"{net.name}: {what}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _simulate(grid) -> dict:
    """Exact data movement on virtual ranks for ragged sizes; prints one line per size."""
    from torus_train.plan.simulate import check

    prime = _next_prime(grid.size + 1)
    results = []
    for n in (1, 7, 97, prime):
        r = check(grid.x, grid.y, n, seed=n)
        results.append(r.__dict__ | {"ok": r.ok})
        click.echo(f"# simulate {grid}: {r.ranks} virtual ranks, {n} int64 elements each: {r.steps} steps "
                   f"(expected {r.expected_steps}), {r.wrong_ranks} ranks wrong, {r.seconds:.2f} s "
                   f"-> {'exact sum on every rank' if r.ok else 'FAILED'}")
    if not all(r["ok"] for r in results):
        from torus_train.errors import RunFailed
        raise RunFailed(f"virtual-rank torus on {grid} did not give every rank the exact sum")
    return {"grid": str(grid), "results": results}


def _next_prime(n: int) -> int:
    def is_prime(k: int) -> bool:
        return k > 1 and all(k % d for d in range(2, int(k ** 0.5) + 1))
    while not is_prime(n):
        n += 1
    return n


def _check_groups(grid) -> dict:
    """Build every row and column group with the real build_grid_groups on the fake backend, as enough ranks
    that every group is checked from inside by one of its members: rank (i mod Y, i mod X), i < max(X, Y)."""
    t0 = time.perf_counter()
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torus_train.comm.groups import build_grid_groups
    from torus_train.errors import RunFailed

    t_import = time.perf_counter() - t0
    as_ranks = sorted({grid.rank_at(i % grid.y, i % grid.x) for i in range(max(grid.x, grid.y))})
    rows_seen, cols_seen, built = set(), set(), 0
    t1 = time.perf_counter()
    for rank in as_ranks:
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=grid.size)
        try:
            g = build_grid_groups(grid)
            built = (grid.y if grid.x > 1 else 0) + (grid.x if grid.y > 1 else 0)
            if grid.x > 1 and dist.get_process_group_ranks(g.row_group) != grid.row_ranks(g.row):
                raise RunFailed(f"--check-groups: rank {rank}'s row group is not row {g.row} of {grid}")
            if grid.y > 1 and dist.get_process_group_ranks(g.col_group) != grid.col_ranks(g.col):
                raise RunFailed(f"--check-groups: rank {rank}'s column group is not column {g.col} of {grid}")
            rows_seen.add(g.row)
            cols_seen.add(g.col)
        finally:
            dist.destroy_process_group()
    seconds = time.perf_counter() - t1
    ok = len(rows_seen) == grid.y and len(cols_seen) == grid.x
    click.echo(f"# check-groups {grid}: built {built} process groups ({grid.y} rows of {grid.x}, {grid.x} columns "
               f"of {grid.y}) on the fake backend as each of {len(as_ranks)} ranks; every row and column group "
               f"has the right members ({seconds:.2f} s, torch import {t_import:.1f} s)")
    if not ok:
        raise RunFailed(f"--check-groups: only {len(rows_seen)} rows and {len(cols_seen)} columns were checked")
    return {"grid": str(grid), "groups": built, "as_ranks": len(as_ranks), "seconds": seconds, "ok": ok}


def _calibrate(bench_path: str, grid_text, algo, cores, background, llc_mib, compare_path, json_path) -> None:
    """--calibrate: fit this host on the bench rows, print the fit, then predict --grid or hold --compare."""
    from torus_train.plan.calibrate import calibrate, host_grid, read_benches

    if llc_mib is not None and not llc_mib > 0:
        raise UserError(f"--llc-mib: {llc_mib:g} must be > 0")
    rows = read_benches(bench_path)
    other = read_benches(compare_path, "--compare") if compare_path else None
    llc = None if llc_mib is None else int(llc_mib * 2**20)
    cal = calibrate(rows, algo=algo, cores=cores, background=background, llc_bytes=llc)
    sizes = [s for s, _ in cal.rows_used]
    click.echo(f"# calibration from {bench_path}: {cal.algo} on {cal.grid} ({cal.backend}), "
               f"{len(cal.rows_used)} rows used ({min(sizes)}..{max(sizes)} bytes, wrong == 0), "
               f"{cal.rows_skipped} rows left out (other algo/grid or wrong != 0)")
    for line in cal.describe():
        click.echo(f"# {line}")
    g0 = host_grid(cal.grid)
    click.echo(f"{'grid':>6} {'size (B)':>10} {'measured us':>12} {'fitted us':>12} {'fit/meas':>9}")
    for s, t in cal.rows_used:
        f = cal.predict_seconds(g0, s) * 1e6
        click.echo(f"{cal.grid:>6} {s:>10} {t:>12.1f} {f:>12.1f} {f / t:>9.2f}")
    out: dict = {"calibration": cal.__dict__}
    targets = [host_grid(grid_text)] if grid_text else ([] if other else [host_grid("2x4")])
    if targets:
        out["predictions"] = _print_predictions(cal, targets, sizes)
    if other is not None:
        out["comparison"] = _print_comparison(cal, other, compare_path)
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
        click.echo(f"# wrote {json_path}")


def _print_predictions(cal, grids, sizes: list[int]) -> list[dict]:
    """Predicted time and busbw of cal.algo on each grid (all ranks on this host) at each size; returns them as
    JSON rows."""
    predictions = []
    click.echo(f"{'grid':>6} {'size (B)':>10} {'predicted us':>13} {'busbw GB/s':>11}")
    for g in grids:
        for s in sizes:
            t = cal.predict_seconds(g, s)
            bw = cal.predict_busbw(g, s)
            predictions.append({"algo": cal.algo, "grid": str(g), "size_bytes": s, "time_us": t * 1e6,
                                "busbw_gbps": bw})
            click.echo(f"{g!s:>6} {s:>10} {t * 1e6:>13.1f} {bw:>11.4f}")
    click.echo(f"# summary: predicted {cal.algo} on {', '.join(str(g) for g in grids)} from a fit on {cal.grid}")
    return predictions


def _print_comparison(cal, rows: list[dict], path: str) -> list[dict]:
    """Measured against predicted busbw for the rows of cal.algo in another bench file; returns them as JSON."""
    from torus_train.plan.calibrate import compare

    comp = compare(cal, rows)
    if not comp:
        raise UserError(f"--compare: {path} has no rows of {cal.algo} with wrong == 0")
    click.echo(f"{'grid':>6} {'size (B)':>10} {'measured GB/s':>14} {'predicted GB/s':>15} {'pred/meas':>10}")
    for c in comp:
        click.echo(f"{c.grid:>6} {c.size_bytes:>10} {c.measured_busbw:>14.4f} {c.predicted_busbw:>15.4f} "
                   f"{c.ratio:>10.2f}")
    big = [c.ratio for c in comp if c.size_bytes >= 1 << 20]
    tail = (f"; at >= 1 MiB pred/meas {min(big):.2f} to {max(big):.2f}, {sum(abs(r - 1) <= 0.3 for r in big)} of "
            f"{len(big)} within 30%" if big else "")
    click.echo(f"# summary: {cal.algo} fitted on {cal.grid}, compared with {len(comp)} rows of {path}{tail}")
    return [c.__dict__ | {"ratio": c.ratio} for c in comp]


def _compare_run(out: str, bench_path, profile_path, cores, background: float, run_background: float, llc_mib,
                 json_path) -> None:
    """--compare-run: a finished CPU run's measured step (per stage) against the host prediction
    (torus_train.plan.host) from this machine's calibration and a measured step profile."""
    from torus_train.job.algorithms import measured_as
    from torus_train.plan.calibrate import calibrate, host_grid, read_benches
    from torus_train.plan.host import predict_host_step, read_run, read_step_profile
    from torus_train.plan.timeline import model_layers

    rec = read_run(out)
    if rec.device != "cpu":
        raise UserError(f"--compare-run: {out} ran on {rec.device}; only runs on CPU ranks of one host are "
                        f"predicted (from this machine's --calibrate)")
    if bench_path is None:
        raise UserError("--compare-run needs this machine's calibration: --calibrate BENCH.json (from `torus-train "
                        f"bench allreduce --grid {rec.grid} --algo torus --json BENCH.json`)")
    if profile_path is None:
        raise UserError("--compare-run needs a measured step profile: --layer-profile PROF.json (from `python -m "
                        "torus_train.plan.host MODEL PROF.json --image-size N --batch B`)")
    spec = rec.spec
    arch, size = spec["model"]["arch"], int(spec["data"]["image_size"])
    prof = read_step_profile(profile_path)
    if (prof.model, prof.image_size) != (arch, size):
        raise UserError(f"--layer-profile: {profile_path} is {prof.model} at {prof.image_size} px; the run is {arch} "
                        f"at {size} px: measure the run's model")
    algo = measured_as(spec["comm"]["algo"])  # bench rows of the algorithm the run's comm.algo exchanges with
    cal = calibrate(read_benches(bench_path), algo=algo, cores=cores, background=background,
                    llc_bytes=None if llc_mib is None else int(llc_mib * 2**20))
    layers = model_layers(arch, size, int(spec["model"]["num_classes"]))
    ex_bytes = 4 if spec["comm"]["compression"] == "none" else 2
    cap = int(float(spec["comm"]["bucket_mb"]) * 2**20)
    g = host_grid(rec.grid)
    click.echo(f"# compare-run {out}: {g.size} CPU ranks on {rec.grid}, {arch} at {size} px, comm {spec['comm']['algo']},"
               f" buckets of {cap / 2**20:g} MiB, {rec.steps} steps")
    click.echo(f"# calibration: {cal.algo} on {cal.grid} from {bench_path} (alpha {cal.alpha_us:.1f} us, "
               f"{cal.cache_gbytes_per_s:.3f} / {cal.memory_gbytes_per_s:.3f} GB/s per rank in / beyond the cache, "
               f"{cal.cores} cores, bench background {background:g}); run background {run_background:g}")
    a = prof.alone()
    click.echo(f"# profile {profile_path}: one rank alone at batch {prof.batch}, {prof.threads} thread(s): forward "
               f"{a[0] * 1e3:.1f} ms, backward {a[1] * 1e3:.1f} ms, optimizer {a[2] * 1e3:.1f} ms ("
               + ("CPU time" if prof.clock == "cpu" else f"wall time with background {prof.background:g}, divided by "
                  f"its own oversubscription {prof.own_oversubscription:.2f}") + ")"
               + (f"; the loop's own work {prof.loop_overhead() * 1e3:.1f} ms (a one-rank run used "
                  f"{prof.loop_seconds * 1e3:.1f} ms of CPU per step)" if prof.loop_seconds is not None else ""))
    click.echo(f"{'batch/rank':>10} {'measured ms':>12} {'predicted ms':>13} {'pred/meas':>10} {'bound':>9} "
               f"{'timeline ms':>12} {'cores ms':>9} {'exchanges ms':>13}")
    stages = []
    for st in rec.stages:
        h = predict_host_step(cal, prof, g, st["per_rank_batch"], cap, ex_bytes, layers, run_background)
        ratio = h.step_seconds / st["step_seconds"]
        click.echo(f"{st['per_rank_batch']:>10} {st['step_seconds'] * 1e3:>12.1f} {h.step_seconds * 1e3:>13.1f} "
                   f"{ratio:>10.2f} {h.bound:>9} {h.timeline_step_seconds * 1e3:>12.1f} "
                   f"{h.cores_step_seconds * 1e3:>9.1f} {' + '.join(f'{x * 1e3:.1f}' for x in h.bucket_seconds):>13}")
        stages.append(st | {"measured_step_seconds": st["step_seconds"], "predicted_step_seconds": h.step_seconds,
                            "ratio": ratio, "prediction": h.__dict__})
    ratios = ", ".join(f"{s['ratio']:.2f}" for s in stages)
    click.echo(f"# summary: predicted / measured step {ratios} "
               f"(measured: median step_time of metrics.jsonl records after the first of each stage)")
    if json_path:
        d = {"run": out, "grid": rec.grid, "ranks": g.size, "device": rec.device, "steps": rec.steps,
             "calibration": cal.__dict__, "profile": prof.__dict__, "run_background": run_background,
             "stages": stages}
        Path(json_path).write_text(json.dumps(d, indent=2) + "\n")
        click.echo(f"# wrote {json_path}")
