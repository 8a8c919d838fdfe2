"""What `torus-train plan` prints for a plan, as lines of text (pure: no click, no torch).

In the order plan prints them: the inputs with their sources (header_lines), the (grid, bucket cap) pairs the
choice compared (candidate_lines), one row per algorithm (table_lines), what each algorithm stands for
(algorithm_notes), each bucket's exchange per algorithm with what NCCL picks for it (bucket_lines), the
torus's buckets and summary (torus_lines), the sources (source_lines); then the bucket caps (bucket_caps_line)
and the verdict against NCCL (verdict.verdict's text).
"""

from __future__ import annotations

from torus_train.comm.bucketing import FIRST_BUCKET_BYTES
from torus_train.job.topology import parse_grid
from torus_train.plan.cost import BACKWARD_FRACTION, MODELS, allreduce_cost, step_cost
from torus_train.plan.nccl import NCCL_SOURCE
from torus_train.plan.search import Plan
from torus_train.plan.timeline import links_shared, torus_lanes, torus_phase_seconds

CANDIDATES_SHOWN = 8
"""Rows of the (grid, bucket cap) comparison that plan prints (JSON holds them all)."""

WIDTH = 11
"""Column width of the per-bucket table."""


def mb(nbytes: float) -> str:
    """Bytes as MB (10^6) with two decimals."""
    return f"{nbytes / 1e6:.2f}"


def plan_lines(p: Plan) -> list[str]:
    """Everything plan prints for one plan, before the bucket caps and the verdict."""
    return [
        *header_lines(p),
        *candidate_lines(p.candidates),
        "#",
        *table_lines(p),
        *(f"# {line}" for line in algorithm_notes(p)),
        *bucket_lines(p),
        *torus_lines(p),
        *lanes_lines(p),
        *source_lines(p),
    ]


def header_lines(p: Plan) -> list[str]:
    """The plan's inputs: GPUs, model, gradient, network, compute, overlap, step overhead, grid."""
    m = MODELS[p.model]
    lines = [
        f"# torus-train plan: {p.gpus} GPUs, {p.model} ({m.parameters:,} parameters, {p.gradient_dtype} "
        f"gradients = {mb(p.gradient_bytes)} MB), {p.per_gpu_batch} images per GPU"
    ]
    lines += [f"# {line}" for line in p.network.describe()]
    lines.append(
        f"# compute per step: {p.per_gpu_batch} / {p.images_per_second:g} img/s = "
        f"{p.compute_seconds * 1e3:.2f} ms; backward {BACKWARD_FRACTION:.2f} of it; {_overlap_how(p)}"
    )
    if p.step_overhead is not None:
        what = (
            "--step-overhead"
            if p.step_overhead_source == "--step-overhead"
            else "the model's one FITTED constant (docs/plan.md)"
        )
        lines.append(
            f"# every step also pays {p.step_overhead:g} x compute = {p.overhead_seconds * 1e3:.2f} ms unhidden: {what}"
        )
    lines.append(f"# grid {p.grid}: {p.grid_why}; ranks fill nodes by {p.placement}")
    return lines


def _overlap_how(p: Plan) -> str:
    """How the exposed communication is found: the --overlap override, or the bucket timeline."""
    if p.overlap is not None:
        return f"overlap OVERRIDE (--overlap) {p.overlap:g} of the backward pass hides communication"
    share = "layer FLOPs" if p.backward_share == "forward FLOPs" else "the measured --layer-profile"
    return (
        f"overlap derived from the bucket timeline: the run's buckets (at most {FIRST_BUCKET_BYTES / 2**20:g} MiB "
        f"first, then {p.bucket_cap_bytes / 2**20:g} MiB, reverse parameter order), backward shared by {share}, "
        f"each bucket all-reduced in turn"
    )


def candidate_lines(cands: list[dict]) -> list[str]:
    """The (grid, bucket cap) pairs the choice compared, best first (none when the grid was given)."""
    if not cands:
        return []
    lines = [
        f"# {'grid':>9} {'cap MiB':>8} {'buckets':>8} {'fused all-reduce ms':>20} {'exposed ms':>11} "
        f"{'step ms':>9} {'efficiency':>11}"
    ]
    lines += [
        f"# {c['grid']:>9} {c['cap_mb']:>8g} {c['buckets']:>8} {c['allreduce_seconds'] * 1e3:>20.3f} "
        f"{c['exposed_seconds'] * 1e3:>11.3f} {c['step_seconds'] * 1e3:>9.2f} "
        f"{c['scaling_efficiency'] * 100:>10.2f}%"
        for c in cands[:CANDIDATES_SHOWN]
    ]
    if len(cands) > CANDIDATES_SHOWN:
        lines.append(f"# ... {len(cands) - CANDIDATES_SHOWN} more in --json (candidates)")
    return lines


def table_lines(p: Plan) -> list[str]:
    """One row per algorithm: steps, bytes across nodes, all-reduce, busbw, exposed, overlap, step, efficiency."""
    lines = [
        f"{'algorithm':>13} {'steps':>6} {'MB across nodes':>16} {'all-reduce ms':>14} {'busbw GB/s':>11} "
        f"{'exposed ms':>11} {'overlap':>8} {'step ms':>9} {'efficiency':>11}"
    ]
    for a in p.algorithms.values():
        overlap = f"{a.derived_overlap:.3f}" if a.derived_overlap is not None else f"{p.overlap:g}*"
        lines.append(
            f"{a.algo:>13} {a.steps:>6} {mb(a.bytes_across_nodes):>16} {a.allreduce_seconds * 1e3:>14.3f} "
            f"{a.busbw_gbytes_per_s:>11.2f} {a.exposed_seconds * 1e3:>11.3f} "
            f"{overlap:>8} {a.step_seconds * 1e3:>9.2f} {a.scaling_efficiency * 100:>10.2f}%"
        )
    return lines


def algorithm_notes(p: Plan) -> list[str]:
    """One line per algorithm name: what it stands for (textbook, ours, NCCL's), and NCCL's choice."""
    return [
        f"{a.algo:>13}: {a.label}"
        + (f"; for the fused gradient NCCL's model picks {a.nccl_choice}" if a.nccl_choice else "")
        for a in p.algorithms.values()
    ]


def bucket_lines(p: Plan) -> list[str]:
    """Each bucket's all-reduce time (ms) per algorithm, and the (algorithm/protocol) NCCL picks for it;
    none with --overlap (one fused all-reduce, no buckets)."""
    first = next(iter(p.algorithms.values())).timeline
    if first is None:
        return []
    algos = list(p.algorithms)
    grid = parse_grid(p.grid, p.network.gpus_per_node)
    lines = [
        "# per bucket, all-reduce ms (nccl: the algorithm/protocol its tuning picks for that size):",
        "# " + f"{'bucket':>6} {'MB':>7} " + " ".join(f"{a:>{WIDTH}}" for a in algos) + "  nccl picks",
    ]
    for b in first["buckets"]:
        ms = [p.algorithms[a].timeline["buckets"][b["index"]]["allreduce_seconds"] * 1e3 for a in algos]
        pick = allreduce_cost("nccl", grid, p.network, b["nbytes"], p.placement).nccl_choice
        lines.append(
            "# "
            + f"{b['index']:>6} {b['nbytes'] / 1e6:>7.2f} "
            + " ".join(f"{x:>{WIDTH}.3f}" for x in ms)
            + f"  {pick}"
        )
    return lines


def _members(b: dict) -> str:
    """A bucket's tensors, first to last in parameter order (the reverse of its gradient-ready order)."""
    if b["parameter_count"] == 1:
        return f"1 tensor ({b['first_parameter']})"
    return f"{b['parameter_count']} tensors ({b['last_parameter']} .. {b['first_parameter']})"


def torus_lines(p: Plan) -> list[str]:
    """The torus's buckets on the timeline, its summary, and its efficiency with no and with full overlap."""
    t = p.torus
    lines = [
        f"# torus bucket {b['index']}: {_members(b)}, {mb(b['nbytes'])} MB, ready {b['ready_seconds'] * 1e3:.2f} ms, "
        f"exchange {b['start_seconds'] * 1e3:.2f}..{b['end_seconds'] * 1e3:.2f} ms"
        for b in (t.timeline["buckets"] if t.timeline is not None else [])
    ]
    lines.append(
        f"# summary: torus on {p.grid} predicts {t.allreduce_seconds * 1e3:.3f} ms per all-reduce, "
        f"{t.step_seconds * 1e3:.2f} ms per step, scaling efficiency {t.scaling_efficiency * 100:.2f}% "
        f"(MB across nodes: the busiest rank's bytes sent over NICs per all-reduce)"
    )
    lo, hi = (
        p.compute_seconds / (step_cost(p.compute_seconds, t.allreduce_seconds, o).step_seconds + p.overhead_seconds)
        for o in (0.0, 1.0)
    )
    lines.append(
        f"# torus efficiency with no overlap {lo * 100:.2f}%, with the whole backward pass overlapped {hi * 100:.2f}%"
    )
    return lines


LANES_TIE = 0.005
"""Steps within this fraction of each other: the two lanes neither pay nor lose (search.TIE's margin)."""


def lanes_lines(p: Plan) -> list[str]:
    """The torus's buckets in two lanes (comm/pipeline.py: bucket k+1's row phase beside bucket k's column
    phase) against one bucket's phases after another's, on the same timeline; none without a timeline."""
    t = p.torus.timeline
    if t is None:
        return []
    grid = parse_grid(p.grid, p.network.gpus_per_node)
    shared = links_shared(grid, p.network.gpus_per_node, p.placement)
    ln = torus_lanes(t, torus_phase_seconds(grid, p.network, p.placement), shared)
    ms = [
        f"# torus lanes bucket {b['index']}: row reduce-scatter {_span(b['row_reduce_scatter'])}, column "
        f"all-reduce {_span(b['column_allreduce'])}, row all-gather {_span(b['row_all_gather'])} ms"
        for b in ln.buckets
    ]
    gain = ln.gain_seconds / ln.serial_step_seconds
    verdict = "they pay" if gain > LANES_TIE else "they lose" if gain < -LANES_TIE else "a tie"
    links = "share the NICs, so no two phases run at once" if shared else "use separate links"
    return [
        *ms,
        f"# torus in two lanes (comm/pipeline.py; rows and columns {links}): exposed {ln.exposed_seconds * 1e3:.3f} "
        f"ms, {ln.step_seconds * 1e3:.2f} ms per step, efficiency {ln.scaling_efficiency * 100:.2f}%, against "
        f"{ln.serial_step_seconds * 1e3:.2f} ms with each bucket's phases in turn: {verdict} "
        f"({ln.gain_seconds * 1e3:+.3f} ms)",
    ]


def _span(se: tuple[float, float]) -> str:
    return f"{se[0] * 1e3:.2f}..{se[1] * 1e3:.2f}"


def source_lines(p: Plan) -> list[str]:
    """Where the network's figures and NCCL's model come from."""
    net = p.network
    return [
        "# sources:" + ("" if net.sources else " none given"),
        *(f"#   - {s}" for s in net.sources),
        f"#   - {NCCL_SOURCE}",
    ]


def bucket_caps_line(p: Plan, caps: list[dict]) -> str:
    """The torus step at the plan's bucket cap against the fastest of the caps tried (search.bucket_sweep)."""
    best = min(caps, key=lambda c: c["step_seconds"])
    here = p.torus
    return (
        f"# bucket cap: {p.bucket_cap_bytes / 2**20:g} MiB gives the torus {here.step_seconds * 1e3:.2f} ms "
        f"per step; of {', '.join(str(c['cap_mb']) for c in caps)} MiB the fastest is "
        f"{best['cap_mb']:g} MiB ({best['buckets']} buckets, {best['step_seconds'] * 1e3:.2f} ms, "
        f"{best['scaling_efficiency'] * 100:.2f}%): smaller buckets start exchanging earlier, larger ones "
        f"pay fewer latency terms"
    )
