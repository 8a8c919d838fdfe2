"""The bucket timeline of one training step: the overlap of communication and backward as an output (pure, no
torch at import; only ``model_layers`` imports torch and torchvision to build the model on the meta device).

What it computes, for one model, one all-reduce algorithm and one network:

* the parameters in the run's buckets: the bucket rule of torus_train.comm.bucketing, the one
  ``torus-train run`` builds its buckets by (comm/buckets.py, every comm.algo): the reverse parameter order
  (the order backward makes the gradients ready), each bucket at most its cap, the first at most
  ``first_bucket_cap`` (FIRST_BUCKET_BYTES, 1 MiB), every later one at most ``bucket_cap`` (the spec's
  comm.bucket_mb, 25 MiB by default); the caps count the parameters' own bytes (fp32), whatever dtype the
  exchange uses (comm.compression casts a bucket on the wire, it does not re-bucket);
* each parameter's share of the backward time: its module's forward FLOPs at one image as torch's
  FlopCounterMode counts them (convolutions and linear layers: 2 x multiply-adds) over the model's total, split
  evenly over the module's parameter tensors. Stated simplification: elementwise layers (BatchNorm, ReLU,
  pooling, the residual add: 0.5% of ResNet-50's FLOPs counted at 4 per output value) cost nothing, and the
  backward of every layer is its forward FLOPs times the same factor;
* bucket k is ready when its last gradient is (the backward time summed over the parameters up to it);
* its exchange starts at max(ready_k, end_{k-1}) (exchanges queue one after another on the network) and lasts
  ``allreduce_cost(algo, grid, net, bucket bytes)`` (the same alpha-beta-gamma model as the fused all-reduce,
  so every bucket pays its own latency terms);
* exposed communication = max(0, end of the last exchange - end of the backward pass); step = compute +
  overhead + exposed (overhead: what the caller says every step pays unhidden, 0 by default); scaling
  efficiency = compute / step; the derived overlap = (sum of exchanges - exposed) / backward,
  the fraction of the backward pass that hid communication (what the old ``--overlap`` knob set by hand).

For the torus it also gives the schedule of the training exchange's two lanes (``lanes``, ``torus_lanes``;
torus_train.comm.pipeline): bucket k+1's row reduce-scatter beside bucket k's column all-reduce, bucket k's
all-gather after bucket k+1's reduce-scatter, each phase's time from the cost model; where the rows and the
columns both leave their nodes the two lanes share the NICs and no two phases overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from torus_train.comm.bucketing import FIRST_BUCKET_BYTES, parameter_buckets
from torus_train.errors import UserError
from torus_train.job.algorithms import DEFAULT
from torus_train.job.sections import CommSection
from torus_train.job.topology import Grid
from torus_train.plan.cost import allreduce_cost, node_map
from torus_train.plan.networks import Network

if TYPE_CHECKING:
    import torch  # annotations only: this module imports torch inside the functions that build a model

BUCKET_BYTES = int(CommSection.bucket_mb * 2**20)
"""The run's bucket size by default: the spec's comm.bucket_mb (25 MiB) in bytes."""
PARAM_BYTES = 4
"""Bytes per parameter as the run's bucket caps count them (its parameters are fp32)."""


@dataclass(frozen=True)
class Layer:
    """One parameter tensor as the timeline needs it."""

    name: str
    """Parameter name, e.g. 'layer4.2.conv3.weight'."""
    numel: int
    """Values in the tensor (= gradient values)."""
    flops: float
    """Forward FLOPs at one image attributed to this tensor (its module's FLOPs over its parameter tensors)."""


@lru_cache(maxsize=8)
def model_layers(model: str, image_size: int = 224, num_classes: int = 1000) -> tuple[Layer, ...]:
    """The parameters of torchvision `model` (with `num_classes` outputs) in parameter order with their forward
    FLOPs at one image, from the model built on the meta device (no memory, no weights) and one meta forward
    pass under torch's FLOP counter."""
    m = _meta_model(model, num_classes)
    flops = _forward_flops(m, model, image_size)
    layers = []
    for mname, mod in m.named_modules():
        own = [(n, p) for n, p in mod.named_parameters(recurse=False) if p.requires_grad]
        for n, p in own:
            layers.append((f"{mname}.{n}" if mname else n, p.numel(), flops.get(mname, 0.0) / len(own)))
    # named_modules + own parameters gives the same order as model.parameters() for torchvision models; keep it.
    order = {n: i for i, (n, _) in enumerate(m.named_parameters())}
    layers.sort(key=lambda t: order[t[0]])
    return tuple(Layer(n, int(k), float(f)) for n, k, f in layers)


def _meta_model(model: str, num_classes: int) -> torch.nn.Module:
    """torchvision's `model` built on the meta device; UserError when torch is missing or cannot build it."""
    try:
        import torch
        import torchvision
    except ModuleNotFoundError:
        raise UserError("the bucket timeline needs torch and torchvision (or give --overlap)") from None
    try:
        ctor = getattr(torchvision.models, model)
    except AttributeError:
        raise UserError(f"--model: torchvision has no model {model!r}") from None
    try:
        with torch.device("meta"):
            return ctor(num_classes=num_classes)
    except NotImplementedError as e:  # a constructor that initialises weights by copying data (regnet)
        raise UserError(
            f"the bucket timeline cannot build {model} without memory ({e}); plan's --overlap F skips the timeline"
        ) from None


def _forward_flops(m: torch.nn.Module, model: str, image_size: int) -> dict[str, float]:
    """Forward FLOPs at one image of every module of m that owns parameters, its children's left out: torch's
    FlopCounterMode over one meta forward pass (2 per multiply-add of the convolutions and matrix products;
    elementwise layers, BatchNorm among them, count nothing)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    m.eval()  # one image: BatchNorm in training mode refuses a 1x1 map of one value per channel
    try:
        with counter, torch.no_grad():
            m(torch.empty(1, 3, image_size, image_size, device="meta"))
    except (RuntimeError, ValueError, AssertionError, NotImplementedError) as e:
        reason = " ".join(str(e).split())[:160]
        raise UserError(
            f"the bucket timeline cannot trace {model} at {image_size} px ({reason}); plan's --overlap F "
            f"skips the timeline"
        ) from None
    root = type(m).__name__  # the counter names a module by its path under the model's class name
    total = {
        name.removeprefix(root).removeprefix("."): sum(ops.values()) for name, ops in counter.get_flop_counts().items()
    }
    return {
        name: float(
            total.get(name, 0) - sum(total.get(f"{name}.{c}" if name else c, 0) for c, _ in mod.named_children())
        )
        for name, mod in m.named_modules()
        if any(True for _ in mod.parameters(recurse=False))
    }


@dataclass
class Bucket:
    """One bucket of the step's timeline (seconds from the start of the backward pass)."""

    index: int
    """Position in the exchange order (0 = first to be exchanged)."""
    parameters: list
    """Parameter names, in gradient-ready order."""
    numel: int
    """Gradient values in the bucket."""
    nbytes: int
    """Bytes exchanged (numel x the exchange dtype's bytes)."""
    ready_seconds: float
    """When the backward pass has produced the bucket's last gradient."""
    start_seconds: float
    """When its exchange starts: max(ready, end of the previous exchange)."""
    allreduce_seconds: float
    """Its all-reduce time from the cost model."""
    end_seconds: float
    """start + all-reduce."""


@dataclass
class Timeline:
    """One step's bucket timeline for one algorithm."""

    algo: str
    """The all-reduce algorithm."""
    backward_seconds: float
    """Length of the backward pass."""
    compute_seconds: float
    """Forward + backward."""
    communication_seconds: float
    """Sum of the buckets' all-reduce times."""
    exposed_seconds: float
    """Communication after the end of the backward pass."""
    step_seconds: float
    """compute + overhead + exposed."""
    scaling_efficiency: float
    """compute / step."""
    derived_overlap: float
    """(communication - exposed) / backward: the fraction of the backward pass that hid communication."""
    buckets: list = field(default_factory=list)
    """The buckets."""
    overhead_seconds: float = 0.0
    """Time every step pays with nothing hiding it, beyond compute and exposed communication."""

    def to_json(self) -> dict:
        """The timeline as JSON (bucket parameter lists shortened to their count and ends)."""
        d = asdict(self)
        for b in d["buckets"]:
            names = b.pop("parameters")
            b["parameter_count"] = len(names)
            b["first_parameter"], b["last_parameter"] = names[0], names[-1]
        return d


def bucket_plan(
    layers: Sequence[Layer],
    bucket_cap: int = BUCKET_BYTES,
    first_bucket_cap: int = FIRST_BUCKET_BYTES,
) -> list[list[Layer]]:
    """The layers in the run's buckets (comm.bucketing: reverse parameter order, by their fp32 bytes)."""
    cut = parameter_buckets([layer.numel * PARAM_BYTES for layer in layers], bucket_cap, first_bucket_cap)
    return [[layers[i] for i in b] for b in cut]


def timeline(
    layers: Sequence[Layer],
    compute_seconds: float,
    backward_fraction: float,
    allreduce_seconds_of: Callable[[float], float],
    exchange_bytes: int,
    algo: str = "",
    bucket_cap: int = BUCKET_BYTES,
    first_bucket_cap: int = FIRST_BUCKET_BYTES,
    overhead_seconds: float = 0.0,
) -> Timeline:
    """The step's timeline. allreduce_seconds_of(nbytes) gives one bucket's exchange time; exchange_bytes is
    the bytes per gradient value exchanged (2 for fp16). Backward time is shared over layers by their FLOPs;
    overhead_seconds is added to every step unhidden."""
    backward = backward_fraction * compute_seconds
    total_flops = sum(layer.flops for layer in layers)
    if total_flops <= 0:
        raise UserError("timeline: the layers have no FLOPs to share the backward pass by")
    t, end, buckets, comm = 0.0, 0.0, [], 0.0
    for k, group in enumerate(bucket_plan(layers, bucket_cap, first_bucket_cap)):
        t += backward * sum(layer.flops for layer in group) / total_flops
        numel = sum(layer.numel for layer in group)
        nbytes = numel * exchange_bytes
        c = float(allreduce_seconds_of(nbytes))
        start = max(t, end)
        end = start + c
        comm += c
        buckets.append(Bucket(k, [layer.name for layer in group], numel, nbytes, t, start, c, end))
    exposed = max(0.0, end - backward)
    step = compute_seconds + overhead_seconds + exposed
    derived = min(1.0, max(0.0, (comm - exposed) / backward)) if backward > 0 else 0.0
    return Timeline(
        algo,
        backward,
        compute_seconds,
        comm,
        exposed,
        step,
        compute_seconds / step if step else 1.0,
        derived,
        buckets,
        overhead_seconds,
    )


@dataclass
class Lanes:
    """One step's torus exchange in two lanes (torus_train.comm.pipeline): bucket k+1's row phase beside bucket k's
    column phase. Seconds from the start of the backward pass, as Timeline's."""

    shared_links: bool
    """The row and the column phases both cross nodes: they share the NICs, so no two of them overlap."""
    buckets: list
    """Per bucket: index, and start and end of its row reduce-scatter, column all-reduce and row all-gather."""
    end_seconds: float
    """When the last all-gather ends."""
    exposed_seconds: float
    """Communication after the end of the backward pass."""
    step_seconds: float
    """compute + overhead + exposed."""
    scaling_efficiency: float
    """compute / step."""
    serial_step_seconds: float
    """The same buckets' step with each bucket's three phases one after another (the Timeline's step)."""

    @property
    def gain_seconds(self) -> float:
        """serial step - this step: positive where the two lanes pay."""
        return self.serial_step_seconds - self.step_seconds


def lanes(
    buckets: Sequence[tuple[float, ...]],
    backward_seconds: float,
    compute_seconds: float,
    overhead_seconds: float = 0.0,
    shared_links: bool = False,
) -> Lanes:
    """The two-lane schedule of buckets given as (ready, row reduce-scatter, column all-reduce, row all-gather)
    seconds, in the order comm/pipeline.py issues them: lane R: reduce-scatter k, then all-gather k-1 (after
    column k-1); lane C: column k (after reduce-scatter k); the last all-gather at the end. A phase starts when
    its lane is free and what it follows has ended; with shared_links also when the NICs are free."""
    free = {"row": 0.0, "column": 0.0, "nic": 0.0}
    out: list[dict[str, Any]] = []

    def run(lane: str, after: float, seconds: float) -> tuple[float, float]:
        start = max(after, free[lane], free["nic"] if shared_links else 0.0)
        free[lane] = start + seconds
        if shared_links:
            free["nic"] = start + seconds
        return start, start + seconds

    for k, (ready, scatter, column, gather) in enumerate(buckets):
        scattered = run("row", ready, scatter)
        b: dict[str, Any] = {"index": k, "ready_seconds": ready, "row_reduce_scatter": scattered}
        b["column_allreduce"] = run("column", scattered[1], column)
        if out:
            out[-1]["row_all_gather"] = run("row", out[-1]["column_allreduce"][1], out[-1]["gather_seconds"])
        out.append({**b, "gather_seconds": gather})
    if out:
        out[-1]["row_all_gather"] = run("row", out[-1]["column_allreduce"][1], out[-1]["gather_seconds"])
    end = max((b["row_all_gather"][1] for b in out), default=0.0)
    serial = 0.0
    for ready, scatter, column, gather in buckets:
        serial = max(ready, serial) + scatter + column + gather
    exposed, serial_exposed = max(0.0, end - backward_seconds), max(0.0, serial - backward_seconds)
    step = compute_seconds + overhead_seconds + exposed
    return Lanes(
        shared_links,
        [{k: v for k, v in b.items() if k != "gather_seconds"} for b in out],
        end,
        exposed,
        step,
        compute_seconds / step if step else 1.0,
        compute_seconds + overhead_seconds + serial_exposed,
    )


def torus_phase_seconds(grid: Grid, net: Network, placement: str = "rows") -> Callable[[float], tuple[float, ...]]:
    """phases(nbytes) = (row reduce-scatter, column all-reduce, row all-gather) seconds of the torus on the cost
    model (allreduce_cost's phases; the column all-reduce is its reduce-scatter and all-gather)."""

    def phases(nbytes: float) -> tuple[float, ...]:
        ph = allreduce_cost(DEFAULT, grid, net, int(nbytes), placement).phases
        row = [q.seconds for q in ph if q.name.startswith("row ")]
        column = sum(q.seconds for q in ph if q.name.startswith("column "))
        return (row[0], column, row[-1]) if row else (0.0, column, 0.0)

    return phases


def links_shared(grid: Grid, gpus_per_node: int, placement: str = "rows") -> bool:
    """Whether some row and some column both leave their node (then both lanes use the NICs)."""
    node = node_map(grid, gpus_per_node, placement).reshape(grid.y, grid.x)
    return bool((node != node[:, :1]).any() and (node != node[:1, :]).any())


def torus_lanes(t: dict, phase_seconds: Callable[[float], tuple[float, ...]], shared_links: bool) -> Lanes:
    """The two-lane schedule of a torus Timeline's buckets (its to_json()), each bucket's phases from
    phase_seconds(nbytes) = (row reduce-scatter, column all-reduce, row all-gather) seconds."""
    rows = [(b["ready_seconds"], *phase_seconds(b["nbytes"])) for b in t["buckets"]]
    return lanes(rows, t["backward_seconds"], t["compute_seconds"], t["overhead_seconds"], shared_links)


def layers_with_profile(layers: Sequence[Layer], profile: dict[str, float]) -> tuple[Layer, ...]:
    """The layers with their backward share taken from a measured profile ({module name: seconds}: a GPU
    profiler's, or scripts/experiments/step_profile.py's on a CPU) instead of FLOPs: a module's seconds split
    evenly over its parameter tensors. Every module must be in the profile."""
    per_module: dict[str, int] = {}
    for layer in layers:
        mod = layer.name.rsplit(".", 1)[0] if "." in layer.name else ""
        per_module[mod] = per_module.get(mod, 0) + 1
    missing = sorted(set(per_module) - set(profile))
    if missing:
        raise UserError(f"--layer-profile: no time for module {missing[0]!r} ({len(missing)} missing)")
    out = []
    for layer in layers:
        mod = layer.name.rsplit(".", 1)[0] if "." in layer.name else ""
        out.append(Layer(layer.name, layer.numel, float(profile[mod]) / per_module[mod]))
    return tuple(out)
