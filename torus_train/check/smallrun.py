"""The real training loop (train/loop.py) in this process on a world of one, on synthetic data: what
`torus-train check` runs for its step parts (capture, deterministic repeat, throughput) and what the tests of
the graph probe drive. Imports torch."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torus_train.job.rank import Bootstrap
from torus_train.job.spec import JobSpec, load_spec, parse_override
from torus_train.job.topology import parse_grid
from torus_train.ranks.distributed import init_distributed
from torus_train.train import loop
from torus_train.train.report import choices
from torus_train.train.step import param_digest
from torus_train.train.stop import StopRequest

PRECISIONS = ("fp32", "bf16", "fp16-scaler")
"""The precision paths force_precision sets: fp16-scaler is fp16 autocast with a GradScaler."""


def force_precision(rs: Any, precision: str) -> None:
    """The autocast dtype and loss scaler of ``precision`` on this rank's device, also on CPU (where
    build.amp_settings runs fp32): the same code path as on a GPU."""
    device = rs.boot.device.type
    rs.amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16-scaler": torch.float16}[precision]
    rs.scaler = torch.amp.GradScaler(device) if precision == "fp16-scaler" else None


def world_of_one(backend: str | None = None) -> Bootstrap:
    """A process group of one rank (NCCL where CUDA is, else gloo; or ``backend``) with the grid's groups."""
    return init_distributed(parse_grid("1x1"), 120, environ={}, backend=backend)


def small_spec(
    out: str | Path,
    batch: int,
    steps: int,
    arch: str = "resnet18_w32",
    image_size: int = 32,
    num_classes: int = 10,
    deterministic: bool = False,
    cuda_graphs: str = "auto",
    extra: tuple[str, ...] = (),
) -> JobSpec:
    """``steps`` steps of ``arch`` at per-rank ``batch`` on synthetic data, one stage, nothing saved, a replica
    check only at the end; ``extra`` are more `--set` values."""
    sets = [
        f"model.arch={arch}",
        f"model.num_classes={num_classes}",
        f"model.cuda_graphs={cuda_graphs}",
        "data.source=synthetic",
        f"data.image_size={image_size}",
        f"data.synthetic_samples={batch * (steps + 1)}",
        "data.num_threads=1",
        "grid.gpus=1",
        "grid.grid=1x1",
        "launch.launcher=local",
        "schedule.epochs=1",
        f"schedule.steps={steps}",
        f"schedule.stages=[{{until_epoch=1,global_batch={batch}}}]",
        "schedule.warmup_epochs=0",
        "job.log_every=1000",
        "job.check_every_steps=0",
        f"job.deterministic={str(deterministic).lower()}",
        "job.max_nonfinite_steps=1000",
        "checkpoint.every_steps=0",
        "checkpoint.every_epochs=0",
        "checkpoint.at_end=false",
        "eval.every_epochs=0",
        f"job.out={out}",
        *extra,
    ]
    return load_spec(None, [parse_override(s) for s in sets])


@dataclass
class LoopRun:
    """What one in-process run of the loop ended with."""

    params: torch.Tensor
    """Every parameter, flat float32 on the CPU."""
    digest: str
    """step.param_digest of the parameters (sha256 of their bytes)."""
    choices: dict
    """summary.json's "choices" (report.choices)."""
    img_s: float | None = None
    """Images per second of the steps after ``warm`` (None when none was timed)."""
    capture_seconds: list = field(default_factory=list)
    rel_diff: float | None = None
    """The graph probe's max |replay - eager| / max |parameter| (None: no replay compared)."""
    steps: int = 0
    skipped: int = 0
    """Steps skipped for a non-finite gradient (train/step.py's SKIP_COUNTS "total")."""


def loop_run(
    spec: JobSpec,
    boot: Bootstrap,
    out: Path,
    warm: int = 0,
    precision: str | None = None,
    graphs: Any = None,
    around: Callable | None = None,
) -> LoopRun:
    """The loop's first epoch (``spec.schedule.steps`` steps) in this process. ``precision``: forced as
    force_precision does (fp16-scaler: the GradScaler path, also on a CPU); ``graphs``: a
    train/graphs.StepGraph to use whatever the device (tests hand one whose torch.cuda calls are recorders);
    ``around(step)``: wraps each step (train_step's signature)."""
    Path(out).mkdir(parents=True, exist_ok=True)
    rs = loop.start(spec, boot, out, StopRequest())
    if precision is not None:
        force_precision(rs, precision)
    if graphs is not None:
        rs.graphs = graphs
        rs.choices.pop("cuda_graphs", None)
    mark: dict = {}
    real = loop.train_step

    def timed(rs_: Any, *a: Any, **k: Any) -> torch.Tensor:
        if rs_.pos.global_step == warm:
            _sync(boot.device)
            mark["t"] = time.perf_counter()
        return real(rs_, *a, **k)

    setattr(loop, "train_step", timed if around is None else around(timed))  # noqa: B010  (a test seam)
    try:
        loop.switch_stage(rs, 0)
        loop.run_epoch(rs, 0)
        _sync(boot.device)
    finally:
        setattr(loop, "train_step", real)  # noqa: B010
        if rs.loader is not None:
            rs.loader.close()
        rs.ddp.close()
    done = rs.pos.global_step - warm
    img_s = done * rs.loader_batch / (time.perf_counter() - mark["t"]) if "t" in mark and done > 0 else None
    g = rs.graphs
    return LoopRun(
        params=torch.cat([p.detach().float().reshape(-1) for p in rs.model.parameters()]).cpu(),
        digest=param_digest(rs.model),
        choices=choices(rs),
        img_s=img_s,
        capture_seconds=list(g.capture_seconds) if g is not None else [],
        rel_diff=getattr(g, "last_rel_diff", None),
        steps=rs.pos.global_step,
        skipped=int(rs.skip_counts[1]) if rs.skip_counts is not None else 0,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
