"""Grid choice by predicted time, and a whole plan: every algorithm's cost at one point, or over GPU counts (pure).

The torus's grid decides its cost, so rank_grids evaluates every factor pair X x Y = N with the cost model and
best_grid takes the fastest. make_plan predicts every algorithm's all-reduce, step time and scaling efficiency
at one (GPUs, grid, network, model, batch) point; sweep gives the curves of all-reduce time over GPU counts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields

from torus_train.errors import UserError
from torus_train.job.algorithms import ALGORITHMS, DEFAULT
from torus_train.job.topology import Grid, GridError, check_grid_size, factor_pairs
from torus_train.plan.cost import (
    ALGORITHM_LABELS,
    BACKWARD_FRACTION,
    DTYPE_BYTES,
    MODELS,
    STEP_OVERHEAD,
    AllreduceCost,
    algorithms_for,
    allreduce_cost,
    allreduce_seconds_fn,
    step_cost,
)
from torus_train.plan.networks import Network
from torus_train.plan.timeline import (
    DDP_BUCKET_CAP,
    DDP_FIRST_BUCKET_CAP,
    Layer,
    Timeline,
    layers_with_profile,
    model_layers,
    timeline,
)


def rank_grids(n: int, net: Network, nbytes: int, placement: str = "rows") -> list[tuple[Grid, AllreduceCost]]:
    """Every factor pair X x Y = n with its predicted torus all-reduce, fastest first (ties: fewer steps)."""
    out = []
    for x, y in factor_pairs(n):
        g = Grid(x, y, net.gpus_per_node)
        out.append((g, allreduce_cost(DEFAULT, g, net, nbytes, placement)))
    out.sort(key=lambda gc: (round(gc[1].seconds, 12), gc[1].steps, -gc[0].x))
    return out


def best_grid(n: int, net: Network, nbytes: int, placement: str = "rows") -> tuple[Grid, str]:
    """The grid with the fastest predicted torus all-reduce for n ranks, and why (against the runner-up and
    against the grid with the fewest steps)."""
    if not isinstance(n, int) or n < 1:
        raise GridError(f"--gpus must be a positive integer, got {n!r}")
    ranked = rank_grids(n, net, nbytes, placement)
    g, c = ranked[0]
    why = (
        f"fastest predicted torus of the {len(ranked)} factor pairs, {c.seconds * 1e3:.3f} ms, {c.steps} steps, "
        f"{_fit_to_nodes(g, n, net.gpus_per_node, placement)}"
    )
    if len(ranked) > 1:
        g2, c2 = ranked[1]
        why += f"; next best {g2} {c2.seconds * 1e3:.3f} ms"
    fewest = min(ranked, key=lambda gc: (gc[1].steps, -gc[0].x))
    if fewest[0] != g:
        why += (
            f"; the fewest-steps grid {fewest[0]} ({fewest[1].steps} steps) is predicted "
            f"{fewest[1].seconds * 1e3:.3f} ms: bandwidth, not step count, decides at this size"
        )
    return g, why


def _fit_to_nodes(g: Grid, n: int, k: int, placement: str) -> str:
    """How the rings that lie along the nodes (rows, or columns) meet nodes of k GPUs: what decides their links."""
    ring, side, what = (g.x, "rows", "horizontal") if placement == "rows" else (g.y, "columns", "vertical")
    return (
        "the whole job fits on one node"
        if n <= k
        else f"{side} inside one node: {what} rings on the intra-node links"
        if ring <= k and k % ring == 0
        else f"{side} span {math.ceil(ring / k)} nodes"
        if ring % k == 0
        else f"{side} and nodes do not line up"
    )


@dataclass
class AlgoPlan:
    """One algorithm's line of a plan."""

    algo: str
    """flat | tree | hierarchical | torus."""
    steps: int
    """Sequential communication steps."""
    bytes_across_nodes: float
    """Bytes the busiest rank sends across nodes per all-reduce."""
    allreduce_seconds: float
    """Predicted all-reduce time."""
    step_seconds: float
    """Predicted training step time."""
    scaling_efficiency: float
    """Predicted scaling efficiency, a fraction."""
    busbw_gbytes_per_s: float
    """Predicted nccl-tests bus bandwidth of the all-reduce."""
    exposed_seconds: float = 0.0
    """Communication not hidden behind the backward pass."""
    derived_overlap: float | None = None
    """Fraction of the backward pass that hid communication, from the bucket timeline (None with --overlap)."""
    timeline: dict | None = None
    """The bucket timeline of one step (torus_train.plan.timeline.Timeline.to_json), when it decided the step."""
    nccl_choice: str | None = None
    """NCCL algorithms: the algorithm/protocol NCCL's model picks for the fused gradient; None for ours."""
    label: str = ""
    """What the name stands for (cost.ALGORITHM_LABELS): textbook, ours, or NCCL's."""


@dataclass
class Plan:
    """Predictions for one (GPUs, grid, network, model, batch) point."""

    gpus: int
    """World size."""
    grid: str
    """The grid used for the torus and hierarchical algorithms."""
    grid_why: str
    """Why this grid (chosen or given)."""
    network: Network
    """The network described."""
    model: str
    """Model name."""
    gradient_dtype: str
    """Dtype gradients are exchanged in."""
    gradient_bytes: int
    """Bytes per all-reduce."""
    per_gpu_batch: int
    """Images per GPU per step."""
    images_per_second: float
    """Single-GPU training throughput used."""
    overlap: float | None
    """--overlap override: fraction of the backward pass that hides communication; None = from the timeline."""
    placement: str
    """How ranks fill nodes: rows (a node's ranks in one row) or columns."""
    compute_seconds: float
    """Per-step compute on one GPU."""
    algorithms: dict
    """algo -> AlgoPlan."""
    bucket_cap_bytes: int = DDP_BUCKET_CAP
    """DDP's bucket cap used by the timeline (the first bucket's is DDP_FIRST_BUCKET_CAP)."""
    backward_share: str = "forward FLOPs"
    """What shares the backward pass over layers: "forward FLOPs" or "measured profile"."""
    layers: tuple = ()
    """The layers the timeline used (not in JSON)."""
    candidates: list = field(default_factory=list)
    """The (grid, bucket cap) pairs compared to choose the grid (no --grid given), fastest first; else empty."""
    step_overhead: float | None = None
    """Fraction of the compute every step also pays unhidden (STEP_OVERHEAD, fitted, or --step-overhead); None
    with --overlap (the old model has none)."""

    @property
    def torus(self) -> AlgoPlan:
        """The torus's line (every plan has one)."""
        return self.algorithms[DEFAULT]

    @property
    def overhead_seconds(self) -> float:
        """Seconds every step pays unhidden."""
        return (self.step_overhead or 0.0) * self.compute_seconds

    @property
    def step_overhead_source(self) -> str | None:
        """Where step_overhead comes from: the fitted constant or --step-overhead (None with --overlap)."""
        if self.step_overhead is None:
            return None
        return "fitted (STEP_OVERHEAD)" if self.step_overhead == STEP_OVERHEAD else "--step-overhead"

    def to_json(self) -> dict:
        """The plan as JSON: every input (the network with its sources) and every algorithm's line."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("network", "algorithms", "layers")}
        net = asdict(self.network)
        net["sources"] = list(self.network.sources)
        d["network"] = net
        d["backward_fraction"] = BACKWARD_FRACTION
        d["overlap_source"] = "override (--overlap)" if self.overlap is not None else "bucket timeline"
        d["step_overhead_source"] = self.step_overhead_source
        d["first_bucket_cap_bytes"] = DDP_FIRST_BUCKET_CAP
        d["algorithms"] = {a: asdict(p) for a, p in self.algorithms.items()}
        return d


def _layers(model: str, overlap: float | None, layer_profile: dict | None) -> tuple:
    """The model's layers for the bucket timeline (with a measured profile's times where given); none with a
    stated overlap, which takes the whole gradient as one all-reduce."""
    layers = model_layers(model) if overlap is None else ()
    return layers_with_profile(layers, layer_profile) if layers and layer_profile is not None else layers


def _step_timeline(
    layers: tuple,
    compute: float,
    gradient_dtype: str,
    bucket_cap: int,
    overhead: float,
    algo: str,
    cost: Callable[[float], float],
) -> Timeline:
    """One algorithm's step on the bucket timeline: the backward pass's buckets, each exchanged at ``cost``."""
    return timeline(
        layers,
        compute,
        BACKWARD_FRACTION,
        cost,
        DTYPE_BYTES[gradient_dtype],
        algo,
        bucket_cap,
        overhead_seconds=overhead,
    )


def make_plan(
    gpus: int,
    net: Network,
    model: str = "resnet50",
    per_gpu_batch: int = 32,
    grid: Grid | None = None,
    gradient_dtype: str = "fp16",
    images_per_second: float | None = None,
    overlap: float | None = None,
    placement: str = "rows",
    bucket_cap: int | None = DDP_BUCKET_CAP,
    layer_profile: dict | None = None,
    step_overhead: float = STEP_OVERHEAD,
) -> Plan:
    """Predict every algorithm at `gpus` GPUs; with no grid, choose the torus grid (and, with bucket_cap None,
    the bucket cap) by the predicted step (choose_grid_and_cap; with --overlap, by the fused all-reduce).

    overlap None (the default): each algorithm's step comes from the bucket timeline (DDP's buckets of the
    model, each all-reduced with that algorithm, queued; torus_train.plan.timeline). A number: the old stated
    overlap, an override, with the whole gradient as one all-reduce. step_overhead: the fraction of the compute
    every timeline step also pays unhidden (the fitted STEP_OVERHEAD unless given; not used with overlap)."""
    _check_plan_inputs(gpus, per_gpu_batch, model, gradient_dtype, bucket_cap, step_overhead)
    nbytes = MODELS[model].gradient_bytes(gradient_dtype)
    images_per_second = _throughput(net, model, images_per_second)
    compute = per_gpu_batch / images_per_second
    overhead = step_overhead * compute
    layers = _layers(model, overlap, layer_profile)
    grid, bucket_cap, why, candidates = _grid_and_cap(
        gpus,
        net,
        grid,
        nbytes,
        placement,
        overlap,
        bucket_cap,
        lambda caps: choose_grid_and_cap(
            gpus, net, model, per_gpu_batch, gradient_dtype, compute, placement, layers, caps, overhead
        ),
    )

    step_timeline = functools.partial(_step_timeline, layers, compute, gradient_dtype, bucket_cap, overhead)
    algos = {
        algo: _algo_plan(algo, grid, net, nbytes, placement, compute, overlap, step_timeline)
        for algo in algorithms_for(net, gpus)
    }
    return Plan(
        gpus,
        str(grid),
        why,
        net,
        model,
        gradient_dtype,
        nbytes,
        per_gpu_batch,
        images_per_second,
        overlap,
        placement,
        compute,
        algos,
        bucket_cap,
        "measured profile" if layer_profile is not None else "forward FLOPs",
        tuple(layers),
        [asdict(c) for c in candidates],
        None if overlap is not None else step_overhead,
    )


def _grid_and_cap(
    gpus: int,
    net: Network,
    grid: Grid | None,
    nbytes: int,
    placement: str,
    overlap: float | None,
    bucket_cap: int | None,
    choose: Callable[[Sequence[float]], list[Candidate]],
) -> tuple[Grid, int, str, list[Candidate]]:
    """(grid, bucket cap, why, candidates): the grid given; else with --overlap the fastest fused all-reduce;
    else the (grid, cap) pair of the fastest step that choose(caps) ranks first (the cap fixed when given)."""
    if grid is not None:
        check_grid_size(grid, gpus)
        grid = Grid(grid.x, grid.y, net.gpus_per_node)
        return grid, _cap(bucket_cap), f"given by --grid ({grid.torus_steps} torus steps)", []
    if overlap is not None:
        grid, why = best_grid(gpus, net, nbytes, placement)
        return grid, _cap(bucket_cap), why, []
    candidates = choose(BUCKET_CAPS_MB if bucket_cap is None else (bucket_cap / 2**20,))
    best = candidates[0]
    x, y = map(int, best.grid.split("x"))
    return (
        Grid(x, y, net.gpus_per_node),
        int(best.cap_mb * 2**20),
        why_chosen(candidates),
        candidates,
    )


def _cap(bucket_cap: int | None) -> int:
    return DDP_BUCKET_CAP if bucket_cap is None else bucket_cap


def _algo_plan(
    algo: str,
    grid: Grid,
    net: Network,
    nbytes: int,
    placement: str,
    compute: float,
    overlap: float | None,
    step_timeline: Callable[[str, Callable[[float], float]], Timeline],
) -> AlgoPlan:
    """One algorithm's line: its fused all-reduce, and its step from the stated overlap or from
    step_timeline(algo, seconds per bucket size)."""
    c = allreduce_cost(algo, grid, net, nbytes, placement)
    label = ALGORITHM_LABELS[algo]
    if overlap is not None:
        s = step_cost(compute, c.seconds, overlap)
        return AlgoPlan(
            algo,
            c.steps,
            c.bytes_across_nodes,
            c.seconds,
            s.step_seconds,
            s.scaling_efficiency,
            c.busbw_gbytes_per_s,
            s.exposed_seconds,
            nccl_choice=c.nccl_choice,
            label=label,
        )
    t = step_timeline(algo, allreduce_seconds_fn(algo, grid, net, placement))
    return AlgoPlan(
        algo,
        c.steps,
        c.bytes_across_nodes,
        c.seconds,
        t.step_seconds,
        t.scaling_efficiency,
        c.busbw_gbytes_per_s,
        t.exposed_seconds,
        t.derived_overlap,
        t.to_json(),
        c.nccl_choice,
        label,
    )


BUCKET_CAPS_MB = (1, 2, 5, 10, 25, 50, 100, 200)
"""Bucket caps (MiB) that bucket_sweep tries."""


def bucket_sweep(p: Plan, algo: str = DEFAULT, caps_mb: Sequence[float] = BUCKET_CAPS_MB) -> list[dict]:
    """The plan's step with each DDP bucket cap for one algorithm (its grid, network, model and batch), from
    the bucket timeline: [{cap_mb, buckets, exposed_seconds, step_seconds, scaling_efficiency}], in caps order."""
    x, y = map(int, p.grid.split("x"))
    g = Grid(x, y, p.network.gpus_per_node)
    layers = p.layers or model_layers(p.model)
    out, cost = [], allreduce_seconds_fn(algo, g, p.network, p.placement)
    for cap in caps_mb:
        t = timeline(
            layers,
            p.compute_seconds,
            BACKWARD_FRACTION,
            cost,
            DTYPE_BYTES[p.gradient_dtype],
            algo,
            int(cap * 2**20),
            overhead_seconds=p.overhead_seconds,
        )
        out.append(
            {
                "cap_mb": cap,
                "buckets": len(t.buckets),
                "exposed_seconds": t.exposed_seconds,
                "step_seconds": t.step_seconds,
                "scaling_efficiency": t.scaling_efficiency,
            }
        )
    return out


@dataclass
class Candidate:
    """One (grid, bucket cap) pair that choose_grid_and_cap compared, with its predicted torus step."""

    grid: str
    """XxY."""
    cap_mb: float
    """DDP bucket cap, MiB."""
    buckets: int
    """Buckets the model's gradients make at this cap."""
    allreduce_seconds: float
    """The fused all-reduce of the whole gradient on this grid (what the grid alone decides)."""
    exposed_seconds: float
    """Communication after the end of the backward pass, from the bucket timeline."""
    step_seconds: float
    """Predicted training step."""
    scaling_efficiency: float
    """compute / step."""


def choose_grid_and_cap(
    gpus: int,
    net: Network,
    model: str,
    per_gpu_batch: int,
    gradient_dtype: str,
    compute_seconds: float,
    placement: str = "rows",
    layers: Sequence[Layer] | None = None,
    caps_mb: Sequence[float] = BUCKET_CAPS_MB,
    overhead_seconds: float = 0.0,
) -> list[Candidate]:
    """The torus step on the bucket timeline for every (grid, bucket cap) pair, fastest first: every factor pair
    X x Y = gpus with every cap of caps_mb (each grid's links worked out once: allreduce_seconds_fn); every
    step also pays overhead_seconds unhidden."""
    layers = layers or model_layers(model)
    nbytes = MODELS[model].gradient_bytes(gradient_dtype)
    out = []
    for x, y in factor_pairs(gpus):
        g = Grid(x, y, net.gpus_per_node)
        cost = allreduce_seconds_fn(DEFAULT, g, net, placement)
        fused = cost(nbytes)
        for cap in caps_mb:
            t = timeline(
                layers,
                compute_seconds,
                BACKWARD_FRACTION,
                cost,
                DTYPE_BYTES[gradient_dtype],
                DEFAULT,
                int(cap * 2**20),
                overhead_seconds=overhead_seconds,
            )
            out.append(
                Candidate(
                    f"{x}x{y}", cap, len(t.buckets), fused, t.exposed_seconds, t.step_seconds, t.scaling_efficiency
                )
            )
    # ties (within a nanosecond): fewer buckets, then longer rows
    return sorted(out, key=lambda c: (round(c.step_seconds, 9), c.buckets, -int(c.grid.split("x")[0])))


def why_chosen(cands: list[Candidate]) -> str:
    """Why the first candidate: its step, the runner-up's, the grid with the fastest fused all-reduce."""
    best = cands[0]
    grids = len({c.grid for c in cands})
    caps = len({c.cap_mb for c in cands})
    why = (
        f"fastest predicted step of {len(cands)} (grid, bucket cap) pairs ({grids} factor pairs x {caps} caps): "
        f"{best.step_seconds * 1e3:.3f} ms with "
        f"{best.cap_mb:g} MiB buckets ({best.buckets}), exposed {best.exposed_seconds * 1e3:.3f} ms"
    )
    other = next((c for c in cands[1:] if (c.grid, c.cap_mb) != (best.grid, best.cap_mb)), None)
    if other is not None:
        why += f"; next best {other.grid} at {other.cap_mb:g} MiB {other.step_seconds * 1e3:.3f} ms"
    fused = min(cands, key=lambda c: (c.allreduce_seconds, -int(c.grid.split("x")[0])))
    if fused.grid != best.grid:
        step = min(c.step_seconds for c in cands if c.grid == fused.grid)
        why += (
            f"; the grid with the fastest single all-reduce, {fused.grid} ({fused.allreduce_seconds * 1e3:.3f} "
            f"ms), gives {step * 1e3:.3f} ms per step: the timeline, not the fused all-reduce, decides"
        )
    return why


def _check_plan_inputs(
    gpus: int,
    per_gpu_batch: int,
    model: str,
    gradient_dtype: str,
    bucket_cap: int | None = None,
    step_overhead: float = 0.0,
) -> None:
    """Raise UserError naming the option when a plan input is not usable."""
    if not isinstance(gpus, int) or gpus < 1:
        raise UserError(f"--gpus: {gpus!r} must be a positive integer")
    if per_gpu_batch < 1:
        raise UserError(f"--per-gpu-batch: {per_gpu_batch!r} must be a positive integer")
    if model not in MODELS:
        raise UserError(f"--model: unknown model {model!r}; known: {', '.join(MODELS)}")
    if gradient_dtype not in DTYPE_BYTES:
        raise UserError(f"--grad-dtype: {gradient_dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    if bucket_cap is not None and not bucket_cap > 0:
        raise UserError(f"--bucket-cap-mb: {bucket_cap / 2**20:g} must be > 0")
    if not (step_overhead >= 0 and math.isfinite(step_overhead)):
        raise UserError(f"--step-overhead: {step_overhead!r} must be a number >= 0")


def _throughput(net: Network, model: str, images_per_second: float | None) -> float:
    """Single-GPU images per second: the given figure, else the network's for this model."""
    if images_per_second is None:
        if model not in net.images_per_second:
            raise UserError(
                f"--images-per-second: network {net.name} has no throughput figure for {model}; "
                f"give one (known for: {', '.join(net.images_per_second) or 'none'})"
            )
        images_per_second = float(net.images_per_second[model])
    if not images_per_second > 0:
        raise UserError(f"--images-per-second: {images_per_second!r} must be > 0")
    return images_per_second


def _grid_pool(algo: str, grids: list[Grid], per_node: list[Grid]) -> list[Grid]:
    """The grids `algo` is weighed on (the table's `grids`; NCCL's algorithms do not depend on the grid)."""
    kind = ALGORITHMS.get(algo).grids if algo in ALGORITHMS else "one"
    return {"any": grids, "per_node": per_node}.get(kind, grids[:1])


def sweep(
    net: Network, nbytes: int, gpu_counts: Iterable[int], placement: str = "rows"
) -> dict[str, list[tuple[int, float]]]:
    """Predicted all-reduce seconds per algorithm for each GPU count: torus on its fastest grid, hierarchical
    with one leader per node (rows of K = GPUs per node, its definition; any grid when K does not divide the
    count), flat and tree (which do not depend on the grid) as they are."""
    algos = [a for a in algorithms_for(net) if a != "nccl-collnet"]  # CollNet: opt-in, and none on one node
    out: dict[str, list[tuple[int, float]]] = {a: [] for a in algos}
    k = net.gpus_per_node
    for n in gpu_counts:
        grids = [Grid(x, y, k) for x, y in factor_pairs(n)]
        per_node = [g for g in grids if g.x == k] or grids
        for a in algos:
            pool = _grid_pool(a, grids, per_node)
            out[a].append((n, min(allreduce_cost(a, g, net, nbytes, placement).seconds for g in pool)))
    return out


VERDICT_COUNTS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 2176, 4096)
"""GPU counts the verdict scans for where the torus starts (or stops) beating NCCL."""

TIE = 0.005
"""Step times within this fraction of each other are a tie: the model cannot tell them apart."""


def torus_vs_nccl_step(gpus: int, net: Network, p: Plan) -> dict:
    """At `gpus` GPUs with p's model, batch, dtype, bucket cap and overhead: the torus on its fastest grid
    against what NCCL's tuning chooses, both on the bucket timeline. {gpus, grid, torus_step_seconds,
    nccl_step_seconds, torus_efficiency, nccl_efficiency, outcome: torus | nccl | tie}."""
    layers = p.layers or model_layers(p.model)
    cap_mb = p.bucket_cap_bytes / 2**20
    best = choose_grid_and_cap(
        gpus,
        net,
        p.model,
        p.per_gpu_batch,
        p.gradient_dtype,
        p.compute_seconds,
        p.placement,
        layers,
        (cap_mb,),
        p.overhead_seconds,
    )[0]
    g = Grid(gpus, 1, net.gpus_per_node)
    t = timeline(
        layers,
        p.compute_seconds,
        BACKWARD_FRACTION,
        allreduce_seconds_fn("nccl", g, net),
        DTYPE_BYTES[p.gradient_dtype],
        "nccl",
        p.bucket_cap_bytes,
        overhead_seconds=p.overhead_seconds,
    )
    return _outcome(
        {
            "gpus": gpus,
            "grid": best.grid,
            "torus_step_seconds": best.step_seconds,
            "nccl_step_seconds": t.step_seconds,
            "torus_efficiency": best.scaling_efficiency,
            "nccl_efficiency": t.scaling_efficiency,
        }
    )


def _outcome(row: dict) -> dict:
    """Add who wins the step (a tie within TIE) and the margin: nccl step - torus step, and over nccl's step."""
    gain = row["nccl_step_seconds"] - row["torus_step_seconds"]
    row["torus_gain_seconds"] = gain
    row["torus_gain_fraction"] = gain / row["nccl_step_seconds"]
    row["outcome"] = "tie" if abs(row["torus_gain_fraction"]) < TIE else (DEFAULT if gain > 0 else "nccl")
    return row


def verdict(p: Plan, counts: Iterable[int] = VERDICT_COUNTS) -> dict:
    """Whether the torus beats NCCL's own choice on p's network: at p's point (its grid), and over GPU counts,
    from which count on it starts (or stops) to. Returns {here, scan, text}; text is what plan prints."""
    t, n = p.algorithms[DEFAULT], p.algorithms["nccl"]
    here = _outcome(
        {
            "gpus": p.gpus,
            "grid": p.grid,
            "torus_step_seconds": t.step_seconds,
            "nccl_step_seconds": n.step_seconds,
            "torus_efficiency": t.scaling_efficiency,
            "nccl_efficiency": n.scaling_efficiency,
            "torus_allreduce_seconds": t.allreduce_seconds,
            "nccl_allreduce_seconds": n.allreduce_seconds,
            "nccl_choice": n.nccl_choice,
            "cap_mb": p.bucket_cap_bytes / 2**20,
        }
    )
    if p.overlap is None:
        best = min(bucket_sweep(p, "nccl"), key=lambda c: c["step_seconds"])
        here["nccl_best_cap_mb"], here["nccl_best_cap_step_seconds"] = best["cap_mb"], best["step_seconds"]
    counts = sorted({c for c in counts if c > 1} | {p.gpus})
    scan = [here if c == p.gpus else torus_vs_nccl_step(c, p.network, p) for c in counts]
    return {"here": here, "scan": scan, "text": verdict_text(here, scan, p.network.name)}


def verdict_text(here: dict, scan: list[dict], network: str) -> list[str]:
    """The verdict in words: who wins at this point and by how much per step, then where that changes."""
    ms = abs(here["torus_gain_seconds"]) * 1e3
    pct = abs(here["torus_gain_fraction"]) * 100
    who = {
        DEFAULT: f"the torus beats NCCL by {ms:.2f} ms per step ({pct:.1f}% of NCCL's step)",
        "nccl": f"NCCL beats the torus by {ms:.2f} ms per step ({pct:.1f}% of NCCL's step): the torus LOSES here",
        "tie": f"the torus and NCCL tie ({ms:.2f} ms per step apart, under {TIE * 100:g}%)",
    }[here["outcome"]]
    lines = [
        f"verdict on {network} at {here['gpus']} GPUs, grid {here['grid']}: {who} "
        f"(torus {here['torus_step_seconds'] * 1e3:.2f} ms, {here['torus_efficiency'] * 100:.2f}%; NCCL "
        f"{here['nccl_step_seconds'] * 1e3:.2f} ms, {here['nccl_efficiency'] * 100:.2f}%)"
    ]
    if "torus_allreduce_seconds" in here:
        ratio = here["torus_allreduce_seconds"] / here["nccl_allreduce_seconds"]
        lines.append(
            f"one fused all-reduce of the gradient: torus {here['torus_allreduce_seconds'] * 1e3:.3f} ms, "
            f"NCCL ({here['nccl_choice']}) {here['nccl_allreduce_seconds'] * 1e3:.3f} ms, torus/NCCL "
            f"{ratio:.2f}; the step hides most of either behind the backward pass"
        )
    if "nccl_best_cap_mb" in here:
        lines.append(
            f"NCCL at its own best bucket cap ({here['nccl_best_cap_mb']:g} MiB): "
            f"{here['nccl_best_cap_step_seconds'] * 1e3:.2f} ms per step (the comparison above gives both "
            f"the plan's cap, {here.get('cap_mb', 0):g} MiB)"
        )
    lines.append("over GPU counts: " + _where_it_changes(scan))
    return lines


def _where_it_changes(scan: list[dict]) -> str:
    """From which GPU count the torus starts (or stops) to beat NCCL, in words."""
    wins = [(r["gpus"], r["outcome"]) for r in scan]
    lo, hi = wins[0][0], wins[-1][0]
    kinds = {o for _, o in wins}
    if kinds == {DEFAULT}:
        return f"the torus wins at every count scanned ({lo}..{hi})"
    if kinds == {"nccl"}:
        return f"NCCL wins at every count scanned ({lo}..{hi}): the torus never pays off on this network"
    if DEFAULT not in kinds:
        return f"the torus never wins ({lo}..{hi}): NCCL wins or ties"
    first = next(n for n, o in wins if o == DEFAULT)
    last = max(n for n, o in wins if o == DEFAULT)
    after = [f"{n} {o}" for n, o in wins if n > last]
    contiguous = all(o == DEFAULT for n, o in wins if first <= n <= last)
    text = (
        f"the torus starts to win at {first} GPUs"
        if contiguous
        else f"the torus first wins at {first} GPUs, not at every count after"
    )
    text += f" and wins up to {last}" + (
        f", then stops ({', '.join(after)})" if after else " (the largest count scanned)"
    )
    return text + "; per count: " + ", ".join(f"{n} {o}" for n, o in wins)
