"""The job spec: one TOML file (plus CLI overrides) -> a validated JobSpec (pure; no torch import).

Every section is a small dataclass with a one-line docstring under each field. Loading rejects unknown keys
and wrong types naming the dotted field path (``schedule.stages[1].global_batch``); ``validate()`` checks
values the same way. CLI flags become dotted overrides (``--gpus 8`` is ``grid.gpus = 8``; ``--set
comm.algo=flat`` sets any field) applied to the raw TOML table before it is built, so they go through the
same checks.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import sys
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib  # novermin (3.11+; vermin does not see the fallback)
else:  # Python 3.10: the same parser from PyPI (a dependency there, see pyproject.toml)
    import tomli as tomllib

from torus_train.errors import UserError
from torus_train.job import algorithms
from torus_train.job.gpus import BACKENDS
from torus_train.job.launchers import choices as launcher_choices
from torus_train.job.models import HOUSE_ARCHS
from torus_train.job.schedule import Schedule, ScheduleError
from torus_train.job.sources import DECODERS, DEFAULT_SOURCE, choices_text
from torus_train.job.topology import MAX_WORLD, parse_grid


class SpecError(UserError):
    """A job spec field that is unknown, of the wrong type, or out of range; the message names its path."""


MAX_IMAGE_SIZE = 8192
MAX_SPEC_BYTES = 1 << 20
MAX_INT = 2**63 - 1
MAX_INT32 = 2**31 - 1
"""Counts that reach torch or DALI as sizes, seeds or step numbers (int32 there)."""
MAX_EPOCHS = 1_000_000
"""schedule.epochs: a rank plans its run epoch by epoch (the ETA's epoch ends), so the count is bounded; a
million epochs is 10,000 times an ImageNet recipe (schedule.steps stops a run sooner)."""
MAX_CLASSES = 1_000_000
"""model.num_classes: a classifier of 1M classes over 2,048 features already holds 8 GB of fp32 weights."""
FIXED_INPUT = {**dict.fromkeys(("vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16", "vit_l_32"), 224), "maxvit_t": 224}
"""Models built for exactly one input size (torchvision's default; their position embeddings or window grid fix it)."""
MIN_INPUT = {
    "inception_v3": 75,
    "alexnet": 64,
    **dict.fromkeys(
        (
            "convnext_base",
            "convnext_large",
            "convnext_small",
            "convnext_tiny",
            "densenet121",
            "densenet161",
            "densenet169",
            "densenet201",
            "vgg11",
            "vgg11_bn",
            "vgg13",
            "vgg13_bn",
            "vgg16",
            "vgg16_bn",
            "vgg19",
            "vgg19_bn",
        ),
        32,
    ),
    "squeezenet1_0": 24,
    "squeezenet1_1": 24,
    "googlenet": 16,
}
"""The smallest input side, of 8, 16, 24, 32, 48, 64, 75, that each model's forward pass takes (the others take
8 px); tests/test_preflight.py checks the table against torchvision."""


def input_size_problem(arch: str, size: int) -> str:
    """Why ``arch`` cannot take ``size`` px images ('' when it can), naming data.image_size."""
    fixed, low = FIXED_INPUT.get(arch), MIN_INPUT.get(arch, 8)
    if fixed and size != fixed:
        return f"data.image_size: {arch} takes only {fixed} px images, not {size}; set --image-size {fixed}"
    if size < low:
        return f"data.image_size: {arch} needs images of at least {low} px, not {size}"
    return ""


"""Every integer field fits a signed 64-bit integer (what torch and the native code take)."""
MAX_BUCKET_MB = 1_048_576.0
MAX_TIMEOUT_S = 31_536_000.0
"""One year: torch turns timeout_s into a timedelta, which overflows far above this."""

# torchvision.models.list_models(module=torchvision.models) of torchvision 0.29, kept here so that validating a
# spec never imports torch; tests/test_input_errors.py compares it with the installed torchvision.
CLASSIFICATION_ARCHS = (
    "alexnet",
    "convnext_base",
    "convnext_large",
    "convnext_small",
    "convnext_tiny",
    "densenet121",
    "densenet161",
    "densenet169",
    "densenet201",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_v2_l",
    "efficientnet_v2_m",
    "efficientnet_v2_s",
    "googlenet",
    "inception_v3",
    "maxvit_t",
    "mnasnet0_5",
    "mnasnet0_75",
    "mnasnet1_0",
    "mnasnet1_3",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "mobilenet_v3_small",
    "regnet_x_16gf",
    "regnet_x_1_6gf",
    "regnet_x_32gf",
    "regnet_x_3_2gf",
    "regnet_x_400mf",
    "regnet_x_800mf",
    "regnet_x_8gf",
    "regnet_y_128gf",
    "regnet_y_16gf",
    "regnet_y_1_6gf",
    "regnet_y_32gf",
    "regnet_y_3_2gf",
    "regnet_y_400mf",
    "regnet_y_800mf",
    "regnet_y_8gf",
    "resnet101",
    "resnet152",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "resnext50_32x4d",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5",
    "shufflenet_v2_x2_0",
    "squeezenet1_0",
    "squeezenet1_1",
    "swin_b",
    "swin_s",
    "swin_t",
    "swin_v2_b",
    "swin_v2_s",
    "swin_v2_t",
    "vgg11",
    "vgg11_bn",
    "vgg13",
    "vgg13_bn",
    "vgg16",
    "vgg16_bn",
    "vgg19",
    "vgg19_bn",
    "vit_b_16",
    "vit_b_32",
    "vit_h_14",
    "vit_l_16",
    "vit_l_32",
    "wide_resnet101_2",
    "wide_resnet50_2",
)


# --------------------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------------------
@dataclass
class JobSection:
    name: str = "torus-train"
    """Job name; the default output folder is runs/<name>."""
    out: str = ""
    """Output folder (metrics.jsonl, summary.json, logs/, checkpoints/); empty = runs/<name>."""
    seed: int = 0
    """Seed for the model initialisation and the data order (the same on every rank)."""
    log_every: int = 10
    """Optimizer steps between two metrics.jsonl lines / progress updates."""
    check_every_steps: int = 100
    """Optimizer steps between two replica checks (parameters, step and data position compared over all ranks
    with one small all-reduce; also before every checkpoint and at the end). 0 = only there."""
    max_nonfinite_steps: int = 5
    """Steps in a row with non-finite gradients (skipped) after which the run fails (exit 1)."""
    deterministic: bool = False
    """Deterministic cuDNN and cuBLAS kernels (no cudnn.benchmark): two identical GPU runs end with the same bits;
    slower (docs/run.md, "Repeatable runs")."""


@dataclass
class GridSection:
    gpus: int = 0
    """World size N (ranks, one per GPU); 0 = X*Y of --grid, else the slots the launcher offers."""
    grid: str = ""
    """XxY: X ranks per row (horizontal ring), Y per column; empty = chosen for N and gpus_per_node."""
    gpus_per_node: int = 0
    """Ranks per node; 0 = from the hostfile/scheduler (slots of the first node) or all ranks locally."""


@dataclass
class LaunchSection:
    launcher: str = "auto"
    """local | mpirun | srun | auto (Slurm job -> srun, PBS job -> mpirun, hostfile -> mpirun, else local)."""
    hostfile: str = ""
    """OpenMPI hostfile (`host slots=K`) or PBS node file (one line per slot) for mpirun."""
    container: str = ""
    """Singularity/Apptainer image; when set every rank runs inside `<container_runtime> exec --nv IMAGE`."""
    container_runtime: str = "singularity"
    """Container command: singularity or apptainer (singularity falls back to apptainer where only that is found)."""
    binds: list[str] = field(default_factory=list)
    """Extra container bind mounts, SRC[:DST[:OPTS]]; the data and output folders are always bound."""
    launcher_args: list[str] = field(default_factory=list)
    """Extra arguments put right after mpirun/srun (e.g. ["--mca", "btl", "^openib"])."""
    cpus_per_rank: int = 0
    """mpirun and srun: CPUs each rank is bound to, beside its GPU, and its OMP_NUM_THREADS; 0 = as the
    scheduler says (srun: SLURM_CPUS_PER_TASK, else SLURM_JOB_CPUS_PER_NODE / ranks per node; PBS: NCPUS /
    ranks per node), and not bound where it says nothing."""
    env: list[str] = field(default_factory=list)
    """Environment passed to every rank: NAME (current value) or NAME=VALUE."""
    python: str = ""
    """Python on the compute nodes; empty = this interpreter (python3 inside a container)."""
    watchdog_s: float = 0.0
    """Local launcher: seconds without a finished step on any rank before it dumps every rank's stack and ends
    the job; 0 = comm.timeout_s + 60. Until every rank has finished its first step the limit is at least that."""


@dataclass
class ModelSection:
    arch: str = "resnet50"
    """torchvision classification architecture (resnet18, resnet50, ...) or a house ResNet (resnet18_w32)."""
    num_classes: int = 1000
    """Output classes; must cover the data set's labels."""
    channels_last: bool = True
    """NHWC memory format for activations and weights (faster convolutions on tensor cores)."""
    precision: str = "fp16"
    """fp32 | fp16 | bf16 forward/backward; fp16 uses a GradScaler; CPU ranks always run fp32."""
    cuda_graphs: str = "auto"
    """auto | off: auto replays each stage's whole step as one CUDA graph on CUDA ranks with NCCL (docs/graphs.md);
    off, and every other rank, runs the same step eagerly."""


@dataclass
class DataSection:
    source: str = DEFAULT_SOURCE
    """synthetic | demo | a folder with train/CLASS/*.JPEG and val/CLASS/*.JPEG | a packed set (`data pack`):
    the data sources of job/sources.py."""
    loader: str = "auto"
    """auto | dali | torchvision (auto = dali when importable)."""
    decoder: str = "auto"
    """Where the torchvision loader decodes JPEGs: auto (gpu when the ranks are on CUDA) | cpu | gpu (nvJPEG,
    with the crop and flip on the GPU); DALI decodes on the GPU whenever the ranks are on CUDA."""
    image_size: int = 224
    """Training crop side in pixels."""
    index: str = ""
    """The data folder's file index (`torus-train data index`); empty = DATA/.torus-train-index, or a folder in
    the cache where DATA is read-only. `run` builds it there when missing and checks it before launching."""
    num_threads: int = 0
    """Decoding threads per rank; 0 = the cores this rank is bound to (or the node's cores / its ranks when
    the launcher bound none)."""
    io_workers: int = 4
    """Reader threads per rank: all file reads happen there, none on the training thread."""
    prefetch: int = 2
    """Batches read and decoded ahead of the training step."""
    shuffle_buffer: int = 8192
    """Packed sets: each run of this many samples of the epoch's shard sequence is shuffled (docs/data.md)."""
    stage: str = "none"
    """none | node: before the first step one rank per node copies the packed set to node-local space and
    the node's ranks read it there (docs/data.md)."""
    stage_dir: str = ""
    """Node-local folder for data.stage = node; empty = $SLURM_TMPDIR, $PBS_JOBFS, $SGE_LOCALDIR or $TMPDIR."""
    stage_timeout_s: float = 3600.0
    """data.stage = node: seconds every rank waits for the slowest node's copy (a wait on the rendezvous store,
    not a collective: comm.timeout_s does not bound it); then the run fails naming the nodes still copying."""
    synthetic_samples: int = 0
    """Images per epoch of synthetic data (0 = the loader's default); small values make short epochs."""
    on_corrupt: str = "fail"
    """fail | skip: an image that does not decode stops the run naming the file, or is replaced in its batch
    by the next readable file (named once in the rank's log, counted in summary.json)."""


@dataclass
class OptimizerSection:
    name: str = "sgd"
    """sgd (momentum SGD) | lars."""
    momentum: float = 0.9
    """Momentum."""
    weight_decay: float = 5e-5
    """Weight decay (never applied to BatchNorm parameters or biases)."""
    nesterov: bool = False
    """Nesterov momentum."""
    trust_coefficient: float = 0.001
    """LARS trust coefficient."""


@dataclass
class CommSection:
    algo: str = algorithms.DEFAULT
    """Gradient all-reduce inside DDP: a name of torus_train.job.algorithms that trains (torus, hierarchical,
    flat, ddp: DDP's own all-reduce, torus-sync: the torus hook without overlap)."""
    compression: str = "none"
    """Gradient compression on the wire: none | fp16 | bf16."""
    bucket_mb: float = 25.0
    """DDP gradient bucket size in MiB (fusion threshold)."""
    timeout_s: float = 600.0
    """Process-group timeout: a collective that cannot finish raises after this many seconds."""
    backend: str = "auto"
    """auto | nccl | gloo: auto = NCCL, one rank per GPU, where the machine has GPUs, else gloo on CPU ranks;
    gloo keeps the ranks on the CPU even where there are GPUs (more ranks than GPUs on one machine)."""


@dataclass
class CheckpointSection:
    every_steps: int = 0
    """Save every this many optimizer steps (0 = not by step count)."""
    every_epochs: int = 1
    """Save at the end of every this many epochs (0 = not by epoch)."""
    keep: int = 2
    """Complete checkpoints to keep (older ones are deleted; the newest good one never)."""
    at_end: bool = True
    """Save when training ends."""


@dataclass
class EvalSection:
    every_epochs: int = 1
    """Evaluate on the val split every this many epochs (0 = never)."""
    target_top1: float = 0.0
    """Top-1 (0..1) whose first reach is recorded as time-to-target in summary.json; 0 = none."""


@dataclass
class JobSpec:
    job: JobSection = field(default_factory=JobSection)
    """Name, output folder, seed, logging interval."""
    grid: GridSection = field(default_factory=GridSection)
    """World size and the XxY grid."""
    launch: LaunchSection = field(default_factory=LaunchSection)
    """How ranks are started."""
    model: ModelSection = field(default_factory=ModelSection)
    """The network and its numerics."""
    data: DataSection = field(default_factory=DataSection)
    """Input pipeline."""
    schedule: Schedule = field(default_factory=Schedule)
    """Epochs, batch-size stages and LR."""
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    """Optimizer."""
    comm: CommSection = field(default_factory=CommSection)
    """Gradient exchange."""
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    """Checkpointing."""
    eval: EvalSection = field(default_factory=EvalSection)
    """Evaluation."""

    # ----------------------------------------------------------------------------------------------
    def validate(self) -> JobSpec:
        """Check value ranges and choices; raise SpecError naming the field path and the bad value."""
        self._check_choices()
        self._check_ranges()
        self._check_optimizer()
        self._check_names()
        return self

    def _check_choices(self) -> None:
        _choice("launch.launcher", self.launch.launcher, launcher_choices())
        _choice("launch.container_runtime", self.launch.container_runtime, ("singularity", "apptainer"))
        _choice("model.precision", self.model.precision, ("fp32", "fp16", "bf16"))
        _choice("model.cuda_graphs", self.model.cuda_graphs, ("auto", "off"))
        _choice("data.loader", self.data.loader, ("auto", "dali", "torchvision"))
        _choice("data.decoder", self.data.decoder, DECODERS.names())
        _choice("data.on_corrupt", self.data.on_corrupt, ("fail", "skip"))
        _choice("data.stage", self.data.stage, ("none", "node"))
        _choice("optimizer.name", self.optimizer.name, ("sgd", "lars"))
        _choice("comm.algo", self.comm.algo, algorithms.training_choices())
        _choice("comm.compression", self.comm.compression, ("none", "fp16", "bf16"))
        _choice("comm.backend", self.comm.backend, BACKENDS)
        if self.comm.compression == "fp16" and self.model.precision != "fp16":
            # divided by the world size before rounding to fp16, small gradients flush to zero without the
            # GradScaler that only model.precision = fp16 brings
            raise SpecError(
                f"comm.compression = fp16 needs model.precision = fp16 (its loss scaler), not "
                f"{self.model.precision!r}; use comm.compression = bf16 or none"
            )

    def _check_ranges(self) -> None:
        _finite_and_bounded(self, "")
        for path, value, low, high in (
            ("job.log_every", self.job.log_every, 1, MAX_INT32),
            ("grid.gpus", self.grid.gpus, 0, MAX_WORLD),
            ("job.seed", self.job.seed, 0, MAX_INT32),
            ("job.check_every_steps", self.job.check_every_steps, 0, MAX_INT32),
            ("job.max_nonfinite_steps", self.job.max_nonfinite_steps, 1, MAX_INT32),
            ("grid.gpus_per_node", self.grid.gpus_per_node, 0, MAX_WORLD),
            ("model.num_classes", self.model.num_classes, 2, MAX_CLASSES),
            ("data.image_size", self.data.image_size, 8, MAX_IMAGE_SIZE),
            ("data.num_threads", self.data.num_threads, 0, 4096),
            ("launch.cpus_per_rank", self.launch.cpus_per_rank, 0, 4096),
            ("data.synthetic_samples", self.data.synthetic_samples, 0, MAX_INT32),
            ("data.io_workers", self.data.io_workers, 1, 256),
            ("data.prefetch", self.data.prefetch, 1, 64),
            ("data.shuffle_buffer", self.data.shuffle_buffer, 1, MAX_INT32),
            ("checkpoint.every_steps", self.checkpoint.every_steps, 0, MAX_INT32),
            ("checkpoint.every_epochs", self.checkpoint.every_epochs, 0, MAX_INT32),
            ("checkpoint.keep", self.checkpoint.keep, 1, MAX_INT32),
            ("eval.every_epochs", self.eval.every_epochs, 0, MAX_INT32),
            *self._schedule_counts(),
        ):
            if value < low:
                raise SpecError(f"{path}: {value!r} must be >= {low}")
            if high is not None and value > high:
                raise SpecError(f"{path}: {value!r} must be <= {high:,}")
        for path, value, high in (
            ("comm.bucket_mb", self.comm.bucket_mb, MAX_BUCKET_MB),
            ("comm.timeout_s", self.comm.timeout_s, MAX_TIMEOUT_S),
            ("data.stage_timeout_s", self.data.stage_timeout_s, MAX_TIMEOUT_S),
        ):
            if not value > 0:
                raise SpecError(f"{path}: {value!r} must be > 0")
            if value > high:
                raise SpecError(f"{path}: {value!r} must be <= {high:,.0f}")
        if self.launch.watchdog_s < 0:
            raise SpecError(f"launch.watchdog_s: {self.launch.watchdog_s!r} must be >= 0 (0 = comm.timeout_s + 60)")

    def _schedule_counts(self) -> list[tuple]:
        """The schedule's counts that reach torch (epochs, steps, batches) as (path, value, low, high)."""
        sc = self.schedule
        rows = [
            ("schedule.epochs", sc.epochs, 0, MAX_EPOCHS),
            ("schedule.steps", sc.steps, 0, MAX_INT32),
            ("schedule.max_per_rank_batch", sc.max_per_rank_batch, 0, MAX_INT32),
        ]
        for i, st in enumerate(sc.stages):
            rows += [
                (f"schedule.stages[{i}].per_rank_batch", st.per_rank_batch, 0, MAX_INT32),
                (f"schedule.stages[{i}].global_batch", st.global_batch, 0, MAX_INT32 * MAX_WORLD),
                (f"schedule.stages[{i}].until_epoch", st.until_epoch, 0, MAX_INT32),
            ]
        return rows

    def _check_optimizer(self) -> None:
        if not 0 <= self.optimizer.momentum < 1:
            raise SpecError(f"optimizer.momentum: {self.optimizer.momentum!r} must be in [0, 1)")
        if not self.optimizer.weight_decay >= 0:
            raise SpecError(f"optimizer.weight_decay: {self.optimizer.weight_decay!r} must be >= 0")
        if not self.optimizer.trust_coefficient > 0:
            raise SpecError(f"optimizer.trust_coefficient: {self.optimizer.trust_coefficient!r} must be > 0")
        if self.optimizer.nesterov and self.optimizer.momentum == 0:
            raise SpecError("optimizer.nesterov = true needs optimizer.momentum > 0")
        if not 0 <= self.eval.target_top1 <= 1:
            raise SpecError(f"eval.target_top1: {self.eval.target_top1!r} must be a fraction in [0, 1]")

    def _check_names(self) -> None:
        """The model, the data source, the schedule, the grid and the launch environment."""
        if self.model.arch not in CLASSIFICATION_ARCHS and self.model.arch not in HOUSE_ARCHS:
            close = difflib.get_close_matches(self.model.arch, (*CLASSIFICATION_ARCHS, *HOUSE_ARCHS), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "e.g. resnet18, resnet50, vit_b_16"
            raise SpecError(f"model.arch: {self.model.arch!r} is not a torchvision classification model; {hint}")
        if not self.data.source:
            raise SpecError(f"data.source: must be one of {choices_text()}")
        try:
            self.schedule.check()
        except ScheduleError as e:
            raise SpecError(str(e)) from None
        if self.grid.grid:
            try:
                parse_grid(self.grid.grid)
            except UserError as e:
                raise SpecError(f"grid.grid: {e}") from None
        for i, item in enumerate(self.launch.env):
            name = item.split("=", 1)[0]
            if not name.replace("_", "a").isalnum() or name[0].isdigit():
                raise SpecError(f"launch.env[{i}]: {item!r} is not NAME or NAME=VALUE")

    @property
    def out_dir(self) -> Path:
        return Path(self.job.out or f"runs/{self.job.name}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """The resolved spec as TOML text (what --dry-run prints)."""
        lines: list[str] = []
        for sec in dataclasses.fields(self):
            obj = getattr(self, sec.name)
            lines.append(f"[{sec.name}]")
            for f in dataclasses.fields(obj):
                v = getattr(obj, f.name)
                if f.name == "stages":  # only the batch field each stage sets
                    v = [{k: x for k, x in dataclasses.asdict(s).items() if x} for s in v]
                lines.append(f"{f.name} = {_toml_value(v)}")
            lines.append("")
        return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(type(v))


def _finite_and_bounded(obj: Any, path: str) -> None:
    """Every float field of a section (and of its nested sections and lists) finite, every integer within
    64 bits; the message names the dotted path."""
    items: list[tuple[str, Any]]
    if dataclasses.is_dataclass(obj):
        items = [(f"{path}.{f.name}" if path else f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    elif isinstance(obj, list):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    else:
        return
    for p, v in items:
        if isinstance(v, bool):
            continue
        if isinstance(v, str) and "\0" in v:
            raise SpecError(f"{p}: {_short(v)} contains a NUL character")
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{p}: {v!r} must be a finite number")
        if isinstance(v, int) and not -MAX_INT <= v <= MAX_INT:
            raise SpecError(f"{p}: {_short(v)} is out of range (at most {MAX_INT:,})")
        _finite_and_bounded(v, p)


def _short(v: Any) -> str:
    """A value for an error line: long numbers and strings cut in the middle."""
    try:
        text = repr(v)
    except ValueError:  # an int past Python's digit limit
        return "a number too large to print"
    return text if len(text) <= 40 else f"{text[:18]}...{text[-18:]} ({len(text)} characters)"


def _choice(path: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"{path}: {value!r} is not one of {', '.join(allowed)}")


# --------------------------------------------------------------------------------------------------------
# building dataclasses from TOML tables, with dotted-path errors
# --------------------------------------------------------------------------------------------------------
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _build(cls: type, table: Any, path: str) -> Any:
    where = path or "the spec"
    if not isinstance(table, dict):
        raise SpecError(f"{where}: expected a table, got {_shown(table)}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        shown = key if _KEY_PART.match(key) else _short(key)
        p = f"{path}.{shown}" if path else shown
        if key not in known:
            raise SpecError(f"{p}: unknown key (known in {where}: {', '.join(known)})")
        kwargs[key] = _convert(hints[key], value, p)
    return cls(**kwargs)


def _convert(tp: Any, value: Any, path: str) -> Any:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise SpecError(f"{path}: expected a list, got {_shown(value)}")
        return [_convert(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise SpecError(f"{path}: {_short(value)} is out of range for a number") from None
    if (tp in (int, float) and isinstance(value, bool)) or not isinstance(value, tp):
        raise SpecError(f"{path}: expected {_TYPE_NAMES.get(tp, tp.__name__)}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    kind = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {_short(value)}"


_KEY_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=value`` -> ("a.b", value); the value is read as TOML (8, 0.5, true, "x", [..]) else as a string.
    A bad token raises SpecError naming it (``--set '=1': ...``)."""
    if "=" not in text:
        raise SpecError(f"--set {_short(text)}: expected FIELD=VALUE, e.g. comm.algo=flat")
    key, raw = (s.strip() for s in text.split("=", 1))
    if not key:
        raise SpecError(f"--set {_short(text)}: no field name before '='; expected FIELD=VALUE, e.g. comm.algo=flat")
    if not all(_KEY_PART.match(part) for part in key.split(".")):
        raise SpecError(
            f"--set {_short(text)}: {_short(key)} is not a dotted field name like comm.algo or schedule.epochs"
        )
    value = _parse_toml_value(raw, f"--set {_short(text)}")
    return key, value


def _parse_toml_value(raw: str, where: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    except (RecursionError, MemoryError):
        raise SpecError(f"{where}: the value is nested too deeply") from None
    except ValueError as e:  # an integer past Python's digit limit
        raise SpecError(f"{where}: {_short(str(e))}") from None


def apply_overrides(table: dict[str, Any], overrides: list[tuple[str, Any]]) -> dict[str, Any]:
    """Set dotted keys in a raw spec table (creating sections); unknown ones fail later when it is built."""
    for key, value in overrides:
        parts = key.split(".")
        node = table
        for i, part in enumerate(parts[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise SpecError(f"{'.'.join(parts[: i + 1])}: is not a section, cannot set {key}")
            node = nxt
        node[parts[-1]] = value
    return table


def read_spec_table(path: str | Path | None) -> dict[str, Any]:
    """The raw TOML table of a spec file, or of the embedded default spec when path is None; every file or
    decoding problem is a SpecError naming the file."""
    if path is None:
        text = resources.files("torus_train.specs").joinpath("default.toml").read_text()
        source = "default spec"
    else:
        source = f"--spec {_short(str(path))}"
        if "\0" in str(path):
            raise SpecError(f"{source}: the file name contains a NUL character")
        p = Path(path)
        try:
            if not p.is_file():
                raise SpecError(f"{source}: no such file")
            if p.stat().st_size > MAX_SPEC_BYTES:
                raise SpecError(f"{source}: {p.stat().st_size:,} bytes; a job spec is at most {MAX_SPEC_BYTES:,}")
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(f"{source}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise SpecError(f"{source}: {e.strerror or e}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{source}: not valid TOML ({e})") from None
    except (RecursionError, MemoryError):
        raise SpecError(f"{source}: values nested too deeply") from None
    except ValueError as e:  # an integer past Python's digit limit
        raise SpecError(f"{source}: not a usable TOML value ({_short(str(e))})") from None


def spec_from_table(table: dict[str, Any]) -> JobSpec:
    """Build and validate a JobSpec from a raw table."""
    return _build(JobSpec, table, "").validate()


def load_spec(path: str | Path | None = None, overrides: list[tuple[str, Any]] | None = None) -> JobSpec:
    """Spec file (or the embedded default) + dotted overrides -> validated JobSpec."""
    return spec_from_table(apply_overrides(read_spec_table(path), overrides or []))
