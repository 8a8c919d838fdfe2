"""What every loader shares: the contract (`Loader`), what it is built from (`LoaderRequest`, `LoaderConfig`),
the per-epoch shard, and the padding convention.

Training shards are padded with real samples wrapped around from the start of the epoch's order (they train
like any other sample). Validation shards are padded the same way, but the padded samples carry label -1:
count a prediction only where ``labels >= 0``, and sum correct and counted over the ranks. Then every
validation image is counted exactly once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torus_train.data.index import DataError, Split
from torus_train.data.packed import PackedSplit
from torus_train.data.packed import epoch_order as packed_order
from torus_train.data.sharding import Shard, shard

# ImageNet channel statistics, in 0..255 and 0..1.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
TRAIN_AREA = (0.35, 1.0)  # random-resized-crop area range (0.08 in He et al.; 0.35 as in fast.ai's DAWNBench)
TRAIN_RATIO = (3 / 4, 4 / 3)  # random-resized-crop aspect ratio range
VAL_CROP = 0.875  # validation: resize the shorter side to size / 0.875, then centre-crop size
PAD_LABEL = -1
log = logging.getLogger("torus_train.data")


def val_resize(image_size: int) -> int:
    """Shorter-side length before the validation centre crop (256 for 224, 36 for 32).

    Rounded so that the margin cut off is even: the centre crop then starts at a whole pixel, where DALI
    and torchvision agree (an odd margin is split differently by the two, shifting the crop by a pixel).
    """
    return image_size + 2 * round(image_size * (1 / VAL_CROP - 1) / 2)


@dataclass
class LoaderConfig:
    """The arguments of make_loader, checked."""

    split: str
    """``train`` (random-resized crop, flip) or ``val`` (resize, centre crop)."""
    rank: int
    """GLOBAL rank: picks the shard."""
    world_size: int
    """Number of shards."""
    batch_size: int
    """Per-rank batch."""
    image_size: int
    """Output height and width."""
    seed: int
    """Seeds the per-epoch order (equal on all ranks) and the augmentations (different per rank)."""
    channels_last: bool
    """Return images in torch.channels_last memory format."""
    num_threads: int
    """Decoding threads (DALI) or worker processes (torchvision) for this rank."""
    dtype: str = "float32"
    """Image dtype delivered: float32, float16 or bfloat16 (the model's autocast dtype on GPUs)."""
    on_corrupt: str = "fail"
    """An image that does not decode: ``fail`` (DataError naming it) or ``skip`` (replaced, see CorruptLog)."""
    io_workers: int = 2
    """Reader processes (DALI's parallel external_source workers) that do all file I/O of this rank."""
    prefetch: int = 2
    """Batches read and decoded ahead of the training step."""
    shuffle_buffer: int = 8192
    """A packed set's in-buffer shuffle: samples permuted within each run of this many (data/packed.py)."""

    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)


@runtime_checkable
class Loader(Protocol):
    """The loader contract: what every data source's loader is (job/sources.py: ``open_loader``), and all that
    the training loop, the evaluation and the tools use of it.

        loader.set_epoch(epoch)          # every rank, the same epoch, before iterating
        for images, labels in loader:    # len(loader) batches
            ...
        loader.close()

    A batch is (images [batch_size, 3, image_size, image_size] in LoaderConfig.dtype, normalised with the
    ImageNet statistics (MEAN, STD), channels_last when asked; labels int64 [batch_size]), both on the
    request's device. ``len(loader)`` is the same on every rank: the epoch's samples are split into equal
    shards by GLOBAL rank, padded with wrapped-around samples; in validation a padded sample's label is
    PAD_LABEL (-1), so that every image is counted once.

    A loader that decodes images may say where, in ``decoder`` (DALI's "mixed" or "cpu", torchvision's "gpu"
    or "cpu"), which summary.json reports; one without the attribute (synthetic, a toy source) reports null.
    """

    kind: str
    """The pipeline that makes the batches, for logs and summaries: "dali", "torchvision", "synthetic", ..."""
    num_samples: int
    """Samples in the split (one epoch over all ranks, before padding)."""
    num_classes: int
    """Label range: labels are in [0, num_classes), or PAD_LABEL in validation."""
    batch_size: int
    """Per-rank batch."""

    @property
    def pad(self) -> int:
        """Padded samples in this rank's shard this epoch."""

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for ``epoch`` (training); every rank calls it with the same epoch."""

    def __len__(self) -> int:
        """Batches per epoch, equal on every rank."""

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        """The epoch's (images, labels) batches of this rank's shard, in order."""

    def close(self) -> None:
        """Release reader threads, worker processes and pipelines now (not at exit)."""


@dataclass
class LoaderRequest:
    """What a data source's loader is built from (train/build.py fills it from the spec and the rank; tools
    through data.make_loader)."""

    cfg: LoaderConfig
    """The checked shape of the loader: split, rank, world size, batch, image size, seed, dtype, threads."""
    device: Any
    """torch.device the batches are delivered on."""
    root: str | None = None
    """A path source's folder (its node-local copy with data.stage = node); None for a named source."""
    pipeline: str = "auto"
    """data.loader for sources that read files: auto, dali or torchvision."""
    num_classes: int | None = None
    """The model's classes: a file source refuses a set with another count; synthetic labels are drawn below it."""
    index: str | None = None
    """A folder's file index (data/index.py); None = its default place."""
    build_index: bool = False
    """Build the index at its default place when missing (single-process tools; ranks are handed the
    launcher's)."""
    verify: bool = False
    """Check every JPEG's markers before the first batch (a full pass over the files: tools only)."""
    samples: int = 0
    """data.synthetic_samples: images per epoch of a source that makes them (0 = its default)."""
    corrupt: CorruptLog | None = None
    """The run's CorruptLog (files skipped under on_corrupt = skip, kept across the loaders of a run)."""
    decoder: str = "auto"
    """data.decoder for the torchvision pipeline: auto, cpu or gpu (job/sources.py: DECODERS)."""


IMAGE_DTYPES = ("float32", "float16", "bfloat16")
ON_CORRUPT = ("fail", "skip")
REPLACEMENT_TRIES = 64


class CorruptLog:
    """The files a rank skipped under ``on_corrupt = skip``, kept across the loaders of a run (one per stage).

    A skipped file's sample is replaced by the next file of the split (in index order) that reads, so the batch
    keeps its size and every rank its step count; in validation the replacement carries label -1 (not counted).
    Each file is named once, in a warning line of the rank's log.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.files: dict[str, int] = {}
        """Skipped file -> how many times it was read and replaced (DALI's reads include prefetched batches)."""
        self.undecodable: dict[str, str] = {}
        """Files whose markers are fine but whose content did not decode (DALI finds them by a pipeline failure:
        kept here so that the next stage's loader replaces them without failing again), with the reason."""

    def note(self, path: str, reason: str, replacement: str) -> None:
        # reader threads note concurrently: count under the lock, so that one of them (the first) warns
        with self._lock:
            first = path not in self.files
            self.files[path] = self.files.get(path, 0) + 1
        if first:
            log.warning(
                "corrupt image skipped (data.on_corrupt = skip): %s (%s); replaced by %s",
                path,
                reason[:200],
                replacement,
            )

    @property
    def samples(self) -> int:
        with self._lock:  # reader threads may still be prefetching when the run's report reads it
            return sum(self.files.values())


def replacement_after(split: Split, i: int, readable) -> int:
    """The first index after ``i`` (wrapping) whose file ``readable(index)`` accepts; DataError after
    REPLACEMENT_TRIES files that are not."""
    n = len(split)
    for k in range(1, min(n, REPLACEMENT_TRIES + 1)):
        j = (i + k) % n
        if readable(j):
            return j
    raise DataError(
        f"{split.files[i]}: cannot decode it, and none of the {min(n - 1, REPLACEMENT_TRIES)} files "
        "after it could replace it (data.on_corrupt = skip); check the data folder with: "
        "torus-train data check"
    )


def epoch_shard(split: Split, cfg: LoaderConfig, epoch: int) -> Shard:
    """This rank's shard of ``split`` in ``epoch``: a packed split's training order in shard units, a folder's
    one global permutation (data/sharding.py), validation in index order."""
    order = None
    if cfg.split == "train" and isinstance(split, PackedSplit):
        order = packed_order(split.starts, epoch, cfg.seed, cfg.shuffle_buffer)
    return shard(
        len(split),
        cfg.rank,
        cfg.world_size,
        cfg.batch_size,
        epoch=epoch,
        seed=cfg.seed,
        shuffle=cfg.split == "train",
        order=order,
    )


class ShardedLoader:
    """Base of the file loaders: holds the split and computes this rank's shard for the current epoch."""

    kind = "?"
    decoder: str | None = None

    def __init__(self, split: Split, cfg: LoaderConfig, device, corrupt: CorruptLog | None = None):
        self.split = split
        self.corrupt = corrupt if corrupt is not None else CorruptLog()
        self.cfg = cfg
        self.device = device
        self.num_samples = len(split)
        self.num_classes = len(split.classes)
        self.classes = split.classes
        self.class_names = getattr(split, "class_names", ())  # words per class where a packed set holds them
        self.batch_size = cfg.batch_size
        self.epoch = 0
        self.shard: Shard = self._shard(0)

    def _shard(self, epoch: int) -> Shard:
        return epoch_shard(self.split, self.cfg, epoch)

    @property
    def pad(self) -> int:
        """Padded samples in this rank's shard this epoch (labels -1 in validation)."""
        return self.shard.pad

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle (training) for ``epoch``; every rank must call it with the same epoch."""
        self.epoch = epoch
        self.shard = self._shard(epoch)

    def __len__(self) -> int:
        return self.shard.steps

    def _mark_padding(self, step: int, labels):
        """In validation, set the labels of padded samples of batch ``step`` to PAD_LABEL."""
        if self.cfg.split != "val" or not self.shard.pad:
            return labels
        first_pad = len(self.shard.indices) - self.shard.pad
        lo = step * self.batch_size
        if lo + self.batch_size > first_pad:
            labels[max(0, first_pad - lo) :] = PAD_LABEL
        return labels

    def close(self) -> None:
        """Release threads and workers."""
