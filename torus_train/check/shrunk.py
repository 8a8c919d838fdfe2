"""The production configuration (scripts/specs/imagenet_2176.toml) shrunk to one GPU: grid 1x1, no cluster
environment, a short schedule; what the acceptance parts (acceptance.py) run on the device, CUDA or, in a
rehearsal, the CPU at toy size. Pure: no torch import."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torus_train.job.spec import JobSpec, load_spec, parse_override

ROOT = Path(__file__).resolve().parents[2]
"""The source checkout: the acceptance check runs the production spec and the photo-like set of its scripts/."""
SPEC = ROOT / "scripts" / "specs" / "imagenet_2176.toml"
PHOTO_LIKE_SET = ROOT / "scripts" / "photo_like_set.py"
CPU_SYNC_COUNTER = ROOT / "tests" / "synccount.py"
"""The host-read counter of the CPU test hosts: a rehearsal's syncs part counts with it (check/syncs.py)."""


@dataclass(frozen=True)
class Shrunk:
    """One acceptance run's settings: its folder, a rehearsal (CPU, toy size) or not, fewer timed steps."""

    out: Path
    """The run's folder: parts/NAME.json (each part's checks), parts/NAME.log, and a folder per part."""
    rehearsal: bool = False
    """On the CPU at toy size (gloo, DALI's CPU decoder, 64 px, per-GPU batch 4 and 8): checks the parts run."""
    quick: bool = False
    """Fewer timed steps and rounds."""

    @property
    def small(self) -> int:
        """The per-GPU batch of the first stage (32; a rehearsal's 4)."""
        return 4 if self.rehearsal else 32

    @property
    def large(self) -> int:
        """The per-GPU batch of the second stage (256; a rehearsal's 8)."""
        return 8 if self.rehearsal else 256

    @property
    def backend(self) -> str:
        return "gloo" if self.rehearsal else "nccl"

    @property
    def dali_decoder(self) -> str:
        """DALI's decoder: mixed (nvJPEG) on a GPU."""
        return "cpu" if self.rehearsal else "mixed"

    @property
    def torchvision_decoder(self) -> str:
        """torchvision's decoder where DALI does not import (data.decoder = auto: the GPU's)."""
        return "cpu" if self.rehearsal else "gpu"

    @property
    def image_size(self) -> int:
        return 64 if self.rehearsal else 224

    def one_gpu(self) -> list[str]:
        """The `--set` values that put the production spec on one GPU."""
        sets = ["grid.gpus=1", "grid.grid=1x1", "grid.gpus_per_node=1", "launch.env=[]", "launch.launcher=local"]
        return [*sets, "schedule.warmup_epochs=0.5", *(["data.image_size=64"] if self.rehearsal else [])]

    def cli_sets(self, extra: list[str]) -> list[str]:
        """`--set` arguments of a `torus-train run --spec SPEC` on one GPU."""
        return [a for s in self.one_gpu() + list(extra) for a in ("--set", s)]

    def loop_spec(
        self,
        out: Path,
        batch: int,
        steps: int,
        precision: str = "fp16",
        deterministic: bool = False,
        image_size: int | None = None,
    ) -> JobSpec:
        """The spec for the in-process loop: synthetic data, ``steps`` steps at per-GPU ``batch``, nothing
        saved; fp16 exchanges in fp16 (with fp16's loss scaler), bf16 in bf16; ``image_size`` in place of the
        run's."""
        sets = [
            *self.one_gpu(),
            f"job.deterministic={str(deterministic).lower()}",
            f"job.out={out}",
            "data.source=synthetic",
            f"data.synthetic_samples={batch * (steps + 1)}",
            "schedule.epochs=1",
            stages(batch),
            f"schedule.steps={steps}",
            "eval.every_epochs=0",
            "checkpoint.every_epochs=0",
            "checkpoint.at_end=false",
            "job.log_every=5",
            "job.check_every_steps=0",
            f"model.precision={precision}",
            "job.max_nonfinite_steps=1000",
            f"comm.compression={precision}",
            *([f"data.image_size={image_size}"] if image_size else []),
        ]
        return load_spec(str(SPEC), [parse_override(s) for s in sets])


def stages(*batches: int) -> str:
    """The `--set` value of one stage per epoch at these global batches."""
    inner = ",".join(f"{{until_epoch={i + 1},global_batch={b}}}" for i, b in enumerate(batches))
    return f"schedule.stages=[{inner}]"
