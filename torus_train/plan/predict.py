"""`torus-train plan`'s main plan: what the command asks for (PlanRequest) and the one call that answers it
(predict): every algorithm's all-reduce, step time and scaling efficiency on a described cluster, the grid and
bucket cap chosen when none is given, the verdict against NCCL, and on request the virtual-rank check
(--simulate) and the pictures. Pure: torch only where the bucket timeline builds the model (plan.timeline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torus_train.errors import UserError, check_number
from torus_train.job.spec import MAX_BUCKET_MB
from torus_train.job.topology import Grid, check_world_size, parse_grid
from torus_train.outfiles import check_plot_output
from torus_train.plan.cost import STEP_OVERHEAD
from torus_train.plan.networks import Network, load_network
from torus_train.plan.plots import WRITER, plot_curves, plot_timeline, require_matplotlib
from torus_train.plan.printout import bucket_caps_line, mb, plan_lines
from torus_train.plan.search import Plan, bucket_sweep, make_plan
from torus_train.plan.simulate import MAX_SIMULATED_RANKS, simulate_grid
from torus_train.plan.verdict import verdict
from torus_train.userfiles import Field, check, read_json

IMAGES_PER_SECOND = (1e-3, 1e9)
"""--images-per-second: the range a GPU's training throughput can be given in (the step time stays finite)."""
MAX_STEP_OVERHEAD = 100.0
"""--step-overhead: at most 100 times the compute unhidden per step."""
MAX_PER_GPU_BATCH = 1 << 30
"""--per-gpu-batch: at most 2**30 images per GPU per step."""
MAX_PROFILE_SECONDS = 1e6
"""A module's backward seconds in a profile: at most 1e6 s, so that sums and shares stay finite."""


@dataclass(frozen=True)
class PlanRequest:
    """The main plan's inputs, as `torus-train plan` takes them (one field per option); checked when made."""

    gpus: int | None = None
    """World size N; None: the size of `grid`."""
    grid: str | None = None
    """XxY (X ranks per row); None: the fastest predicted grid for N."""
    network: str = "abci-v100"
    """A network preset's name or a TOML file."""
    model: str = "resnet50"
    """The model whose gradients are exchanged."""
    per_gpu_batch: int = 32
    """Images per GPU per step."""
    grad_dtype: str = "fp16"
    """Dtype the gradients are exchanged in."""
    images_per_second: float | None = None
    """Single-GPU training throughput; None: the network's figure for the model."""
    overlap: float | None = None
    """OVERRIDE: the fraction of the backward pass that hides one fused all-reduce; None: the bucket timeline."""
    step_overhead: float | None = None
    """Fraction of the compute every step also pays unhidden; None: the fitted STEP_OVERHEAD."""
    placement: str = "rows"
    """How ranks fill nodes: rows or columns."""
    bucket_cap_mb: float | None = None
    """The run's bucket size (comm.bucket_mb, MiB); None: the spec's default with a grid, else chosen with the
    grid."""
    layer_profile: str | None = None
    """JSON file of backward seconds per module, to share the backward pass by instead of layer FLOPs."""
    simulate: bool = False
    """Run the torus's exact data movement on the grid's virtual ranks."""
    plot: str | None = None
    """PNG of the predicted all-reduce time over GPU counts per algorithm."""
    png: str | None = None
    """PNG of one step's bucket timeline."""

    def __post_init__(self) -> None:
        self._check_numbers()
        self._check_outputs()
        if self.gpus is None and not self.grid:  # an empty --grid is none
            raise UserError("--gpus is required (or --grid XxY)")

    def _check_numbers(self) -> None:
        """Every number finite and in range, naming its flag; the step overhead only with the timeline."""
        check_number(
            self.images_per_second, "--images-per-second", IMAGES_PER_SECOND[0], low_ok=True, high=IMAGES_PER_SECOND[1]
        )
        check_number(self.overlap, "--overlap", 0.0, low_ok=True, high=1.0)
        check_number(self.step_overhead, "--step-overhead", 0.0, low_ok=True, high=MAX_STEP_OVERHEAD)
        if self.step_overhead is not None and self.overlap is not None:
            raise UserError("--step-overhead belongs to the bucket timeline, which --overlap replaces; leave one out")
        if self.gpus is not None:
            if self.gpus < 1:
                raise UserError(f"--gpus: {self.gpus} must be at least 1")
            check_world_size(self.gpus, "--gpus")
        if not 1 <= self.per_gpu_batch <= MAX_PER_GPU_BATCH:
            raise UserError(
                f"--per-gpu-batch: {self.per_gpu_batch} must be a positive integer, at most {MAX_PER_GPU_BATCH:,}"
            )
        check_number(self.bucket_cap_mb, "--bucket-cap-mb", 0.0, high=MAX_BUCKET_MB)

    def _check_outputs(self) -> None:
        """The pictures can be written and drawn (matplotlib installed); --png needs the timeline."""
        if self.png is not None and self.overlap is not None:
            raise UserError("--png draws the bucket timeline, which --overlap replaces; leave one out")
        for path, flag in ((self.plot, "--plot"), (self.png, "--png")):
            if path is not None:
                require_matplotlib(flag)
                check_plot_output(path, WRITER, flag)


def predict(req: PlanRequest, echo: Callable[[str], None] = print) -> dict:
    """The plan for req, echoed line by line as `plan` prints it; returns it as the JSON document (the plan's
    inputs and algorithms, then bucket_caps, verdict, and simulation when asked for)."""
    net = load_network(req.network)
    gpus, grid = _world(req, net)
    p = make_plan(
        gpus,
        net,
        req.model,
        req.per_gpu_batch,
        grid,
        req.grad_dtype,
        req.images_per_second,
        req.overlap,
        req.placement,
        None if req.bucket_cap_mb is None else int(req.bucket_cap_mb * 2**20),
        read_layer_profile(req.layer_profile) if req.layer_profile else None,
        STEP_OVERHEAD if req.step_overhead is None else req.step_overhead,
    )
    for line in plan_lines(p):
        echo(line)
    out = p.to_json()
    if p.overlap is None:
        out["bucket_caps"] = bucket_sweep(p)
        echo(bucket_caps_line(p, out["bucket_caps"]))
    out["verdict"] = _verdict(p, echo)
    if req.simulate:
        g = parse_grid(p.grid)
        out["simulation"] = simulate_grid(g.x, g.y, echo)
    _draw(req, p, echo)
    return out


def _world(req: PlanRequest, net: Network) -> tuple[int, Grid | None]:
    """(N, the grid or None): N from --gpus, else from --grid; --simulate's size limit."""
    grid = parse_grid(req.grid, net.gpus_per_node) if req.grid else None
    if req.gpus is not None:
        gpus = req.gpus
    else:
        assert grid is not None  # PlanRequest refuses a request with neither --gpus nor --grid
        gpus = grid.size
    size = grid.size if grid else gpus
    if req.simulate and size > MAX_SIMULATED_RANKS:
        raise UserError(f"--simulate runs on at most {MAX_SIMULATED_RANKS:,} virtual ranks, not {size:,}")
    return gpus, grid


def read_layer_profile(path: str) -> dict:
    """--layer-profile: {module name: backward seconds} from a JSON file (or a step profile's modules)."""
    where = f"--layer-profile: {path}"
    d = read_json(path, where)
    if isinstance(d, dict) and isinstance(d.get("modules"), dict):  # a step profile, whose modules are these
        return check_module_seconds(d["modules"], f"{where}: modules")
    return check_module_seconds(d, where)


def check_module_seconds(d: object, where: str) -> dict:
    """{module name: backward seconds}: finite, in [0, MAX_PROFILE_SECONDS], not all zero."""
    if not isinstance(d, dict) or not d:
        raise UserError(f"{where}: must hold {{module name: seconds >= 0}}, not an empty or other value")
    for name, v in d.items():
        check({"seconds": v}, (Field("seconds", "number", 0, MAX_PROFILE_SECONDS),), f"{where}: {name!r}")
    if not sum(d.values()) > 0:
        raise UserError(f"{where}: every module's seconds are 0; measure the profile again")
    return {k: float(v) for k, v in d.items()}


def _verdict(p: Plan, echo: Callable[[str], None]) -> dict | None:
    """The torus against NCCL's own choice, echoed; None with --overlap or on one GPU (nothing to compare)."""
    if p.overlap is not None or "nccl" not in p.algorithms or p.gpus < 2:
        return None
    v = verdict(p)
    for line in v["text"]:
        echo(f"# {line}")
    return v


def _draw(req: PlanRequest, p: Plan, echo: Callable[[str], None]) -> None:
    """--plot (all-reduce time over GPU counts) and --png (the bucket timeline), each announced when written."""
    if req.plot is not None:
        plot_curves(
            p.network,
            p.gradient_bytes,
            req.plot,
            f"{p.model} {p.gradient_dtype} gradients ({mb(p.gradient_bytes)} MB)",
            p.placement,
            p.gpus,
        )
        echo(f"# wrote plot {req.plot}")
    if req.png is not None:
        plot_timeline(p, req.png)
        echo(f"# wrote timeline {req.png}")
