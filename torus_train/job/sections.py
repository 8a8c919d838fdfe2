"""The job spec's type: one small dataclass per section, a one-line docstring under each field (pure; no torch).

``JobSpec`` is the whole spec as a job runs it; job/spec.py builds one from TOML and flags and validates it
(``load_spec``), and every other module reads it. It lives below job/spec.py and job/sources.py so that both can
name it: the spec's validation asks the data sources' table (job/sources.py), and a source's entry takes the spec.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torus_train.job import algorithms
from torus_train.job.schedule import Schedule

DEFAULT_SOURCE = "synthetic"
"""data.source when a spec names none (the embedded default job names demo)."""


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
    """Gradient bucket size in MiB: a bucket holds at most this many bytes of gradients (the first at most 1 MiB),
    the rule of comm/bucketing.py, which `plan --bucket-cap-mb` predicts with."""
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
class NoiseSection:
    enabled: bool = True
    """Estimate the gradient noise scale B_simple on every step from the gradient exchange (docs/noise.md)."""
    average_epochs: float = 0.25
    """Time constant of its moving averages, in epochs of examples (decay per example, so stages keep them)."""


@dataclass
class JobSpec:
    """The whole job, section by section (job/spec.py's load_spec builds and validates one)."""

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
    noise: NoiseSection = field(default_factory=NoiseSection)
    """The gradient noise scale."""

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
