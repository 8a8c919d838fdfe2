"""A job's training work, printed by `run --dry-run`: images processed x forward FLOPs per image (pure).

Images processed: every optimizer step's global batch over the run (epochs padded to whole steps, as the
loaders pad them; schedule.steps caps it). The count of training images per epoch comes from what is known
without reading the data, as the data source's entry tells it (job/sources.py): the demo set's size, a data
folder's index (its meta.json) when it has been built, a packed set's packed.json, or data.synthetic_samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torus_train.job.models import forward_flops
from torus_train.job.schedule import steps_per_epoch
from torus_train.job.sources import source_of

if TYPE_CHECKING:
    from torus_train.job.schedule import BatchSchedule
    from torus_train.job.spec import JobSpec


def train_images(spec: JobSpec) -> tuple[int | None, str]:
    """(training images per epoch or None, where the figure comes from): the data source's answer."""
    return source_of(spec.data.source).train_images(spec)


def images_processed(schedule: BatchSchedule, images_per_epoch: int) -> int:
    """Images over every step of a BatchSchedule (global batch x steps per epoch, capped at schedule.steps);
    one term per stage, so a spec of 45,826 epochs answers as fast as one of 7."""
    total, steps = 0, 0
    cap, end = schedule.schedule.steps, schedule.schedule.end_epoch
    for st in schedule.stages:
        epochs = min(st.until_epoch, end) - st.start_epoch
        if epochs <= 0:
            continue
        n = steps_per_epoch(images_per_epoch, st.global_batch) * epochs
        if cap:
            n = max(0, min(n, cap - steps))
        steps += n
        total += n * st.global_batch
    return total


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def work_text(spec: JobSpec, schedule: BatchSchedule | None) -> str:
    """'training work: N images x F per image = W' (or what is missing for it), for --dry-run."""
    flops = forward_flops(spec.model.arch, spec.data.image_size, spec.model.num_classes)
    per_epoch, where = train_images(spec)
    f_text = (
        f"{_si(flops, 'FLOP')} per image ({spec.model.arch} at {spec.data.image_size} px, forward)"
        if flops
        else f"FLOPs per image not known for {spec.model.arch} (counted for ResNets)"
    )
    if per_epoch is None or schedule is None:
        return f"training work: images not known ({where}); {f_text}"
    images = images_processed(schedule, per_epoch)
    total = f" = {_si(images * flops, 'FLOP')} (forward; about 3x that with backward)" if flops else ""
    return (
        f"training work: {images:,} images processed ({per_epoch:,} per epoch from {where}, padded to whole "
        f"steps) x {f_text}{total}"
    )
