"""A whole plan: every algorithm's cost at one point, or over GPU counts (pure).

make_plan predicts every algorithm's all-reduce, step time and scaling efficiency at one (GPUs, grid, network,
model, batch) point, on the grid given or chosen (torus_train.plan.grids); bucket_sweep gives the plan's step at
each bucket size; sweep gives the curves of all-reduce time over GPU counts. The verdict against NCCL is
torus_train.plan.verdict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields

from torus_train.comm.bucketing import FIRST_BUCKET_BYTES
from torus_train.errors import UserError
from torus_train.job.algorithms import ALGORITHMS, DEFAULT
from torus_train.job.topology import Grid, factor_pairs
from torus_train.plan.cost import (
    ALGORITHM_LABELS,
    BACKWARD_FRACTION,
    DTYPE_BYTES,
    MODELS,
    STEP_OVERHEAD,
    algorithms_for,
    allreduce_cost,
    allreduce_seconds_fn,
    step_cost,
)
from torus_train.plan.grids import BUCKET_CAPS_MB, StepWork, choose_grid
from torus_train.plan.networks import Network
from torus_train.plan.timeline import BUCKET_BYTES, layers_with_profile, model_layers


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
    bucket_cap_bytes: int = BUCKET_BYTES
    """The run's bucket size (comm.bucket_mb) the timeline uses (the first bucket's cap is FIRST_BUCKET_BYTES)."""
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
    def work(self) -> StepWork:
        """The step as the bucket timeline weighs it; the model's layers by FLOPs where --overlap left them out."""
        return StepWork(
            self.layers or tuple(model_layers(self.model)),
            self.compute_seconds,
            self.gradient_dtype,
            self.overhead_seconds,
            self.placement,
        )

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
        d["first_bucket_cap_bytes"] = FIRST_BUCKET_BYTES
        d["algorithms"] = {a: asdict(p) for a, p in self.algorithms.items()}
        return d


def _layers(model: str, overlap: float | None, layer_profile: dict | None) -> tuple:
    """The model's layers for the bucket timeline (with a measured profile's times where given); none with a
    stated overlap, which takes the whole gradient as one all-reduce."""
    layers = model_layers(model) if overlap is None else ()
    return layers_with_profile(layers, layer_profile) if layers and layer_profile is not None else layers


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
    bucket_cap: int | None = BUCKET_BYTES,
    layer_profile: dict | None = None,
    step_overhead: float = STEP_OVERHEAD,
) -> Plan:
    """Predict every algorithm at `gpus` GPUs; with no grid, choose the torus grid (and, with bucket_cap None,
    the bucket cap) by the predicted step (grids.choose_grid; with --overlap, by the fused all-reduce).

    overlap None (the default): each algorithm's step comes from the bucket timeline (the run's buckets of the
    model, each all-reduced with that algorithm, queued; torus_train.plan.timeline). A number: the old stated
    overlap, an override, with the whole gradient as one all-reduce. step_overhead: the fraction of the compute
    every timeline step also pays unhidden (the fitted STEP_OVERHEAD unless given; not used with overlap)."""
    _check_plan_inputs(gpus, per_gpu_batch, model, gradient_dtype, bucket_cap, step_overhead)
    nbytes = MODELS[model].gradient_bytes(gradient_dtype)
    images_per_second = _throughput(net, model, images_per_second)
    compute = per_gpu_batch / images_per_second
    layers = _layers(model, overlap, layer_profile)
    work = StepWork(layers, compute, gradient_dtype, step_overhead * compute, placement)
    grid, bucket_cap, why, candidates = choose_grid(gpus, net, grid, nbytes, work, overlap, bucket_cap)
    algos = {a: _algo_plan(a, grid, net, nbytes, work, overlap, bucket_cap) for a in algorithms_for(net, gpus)}
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


def _algo_plan(
    algo: str, grid: Grid, net: Network, nbytes: int, work: StepWork, overlap: float | None, bucket_cap: int
) -> AlgoPlan:
    """One algorithm's line: its fused all-reduce, and its step from the stated overlap or from the bucket
    timeline of `work` with buckets of bucket_cap bytes."""
    c = allreduce_cost(algo, grid, net, nbytes, work.placement)
    label = ALGORITHM_LABELS[algo]
    if overlap is not None:
        s = step_cost(work.compute_seconds, c.seconds, overlap)
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
    t = work.timeline(algo, allreduce_seconds_fn(algo, grid, net, work.placement), bucket_cap)
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


def bucket_sweep(p: Plan, algo: str = DEFAULT, caps_mb: Sequence[float] = BUCKET_CAPS_MB) -> list[dict]:
    """The plan's step with each bucket size for one algorithm (its grid, network, model and batch), from
    the bucket timeline: [{cap_mb, buckets, exposed_seconds, step_seconds, scaling_efficiency}], in caps order."""
    x, y = map(int, p.grid.split("x"))
    g = Grid(x, y, p.network.gpus_per_node)
    out, cost, work = [], allreduce_seconds_fn(algo, g, p.network, p.placement), p.work
    for cap in caps_mb:
        t = work.timeline(algo, cost, int(cap * 2**20))
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
