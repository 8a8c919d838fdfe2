"""The torchvision fallback: PIL decoding in DataLoader worker processes, with the DALI path's semantics.

The files and labels are ImageFolder's (sorted class folders); the order is the same per-epoch sharding rule
as DALI's (checks.shard: a DistributedSampler-like permutation, padded to whole batches so every rank takes
the same steps). Training: RandomResizedCrop + RandomHorizontalFlip; validation: Resize(size / 0.875) +
CenterCrop; then ToTensor + Normalize with the ImageNet statistics.

A file PIL cannot decode is a DataError naming it (``on_corrupt = fail``) or, with ``skip``, is replaced in the
worker by the next readable file (base.CorruptLog); the worker returns the skipped name with the sample and this
process logs it, so the count holds across workers.
"""
from __future__ import annotations

import functools
import io
import multiprocessing
import sys

import torch
from PIL import Image
from torchvision import transforms as T

from torus_train.data.base import (MEAN, PAD_LABEL, STD, TRAIN_AREA, TRAIN_RATIO, CorruptLog, LoaderConfig,
                                   ShardedLoader, replacement_after, val_resize)
from torus_train.data.index import DataError, Split
from torus_train.data.readers import sample_reader


def transform(split: str, image_size: int):
    """The torchvision transform for ``split``."""
    if split == "train":
        ops = [T.RandomResizedCrop(image_size, scale=TRAIN_AREA, ratio=TRAIN_RATIO), T.RandomHorizontalFlip()]
    else:
        ops = [T.Resize(val_resize(image_size)), T.CenterCrop(image_size)]
    return T.Compose(ops + [T.ToTensor(), T.Normalize(MEAN, STD)])


def _decode(reader, i: int):
    """Sample i decoded (a folder's file or a packed set's sample); the reader's problem raised as ValueError."""
    data, problem = reader.read(i)
    if problem is not None:
        raise ValueError(problem)
    with Image.open(io.BytesIO(data.tobytes())) as im:
        return im.convert("RGB")


class _Files(torch.utils.data.Dataset):
    """(image, label) per index; with skip=True (image, label, "PATH\tREASON" of a replaced file or "")."""

    def __init__(self, split: Split, tf, skip: bool = False, val: bool = False):
        self.split, self.files, self.labels, self.tf = split, split.files, split.labels, tf
        self.skip, self.val = skip, val
        self.reader = sample_reader(split)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path = self.files[i]
        try:
            img = _decode(self.reader, i)
        except Exception as e:  # PIL raises several types for bad files
            reason = f"{type(e).__name__}: {e}"
            if not self.skip:
                raise DataError(f"{path}: cannot decode ({reason})") from None
            return self._replaced(i, reason)
        return (self.tf(img), self.labels[i], "") if self.skip else (self.tf(img), self.labels[i])

    def _replaced(self, i: int, reason: str):
        got = {}

        def readable(j: int) -> bool:
            try:
                got[j] = _decode(self.reader, j)
            except Exception:
                return False
            return True

        j = replacement_after(self.split, i, readable)
        label = PAD_LABEL if self.val else self.labels[j]
        return self.tf(got[j]), label, f"{self.files[i]}\t{reason}\t{self.files[j]}"


class _ShardSampler(torch.utils.data.Sampler):
    """Yields the loader's current shard (set_epoch swaps it; the DataLoader asks again each pass)."""

    def __init__(self, owner: "TorchvisionLoader"):
        self.owner = owner

    def __iter__(self):
        return iter(self.owner.shard.indices)

    def __len__(self) -> int:
        return len(self.owner.shard.indices)


def _seed_worker(seed: int, rank: int, worker_id: int) -> None:
    torch.manual_seed(seed * 7919 + rank * 104729 + worker_id * 31 + torch.initial_seed() % 1000003)


def _worker_seed(seed: int, rank: int):
    return functools.partial(_seed_worker, seed, rank)  # picklable, for the forkserver context


def _worker_context():
    """None (fork) unless DALI is loaded in this process: a fork beside DALI's running threads can leave a worker
    stuck forever on a lock one of them held (seen with a DALI and a torchvision loader in one process, as
    `bench input` and the tests have). Then forkserver: workers forked from a server that holds only torch."""
    if "nvidia.dali" not in sys.modules:
        return None
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchvision", __name__])
    return ctx


class TorchvisionLoader(ShardedLoader):
    """Iterates (images [B,3,H,W] in cfg.dtype, labels int64 [B]) on ``device`` through a DataLoader."""

    kind = "torchvision"

    def __init__(self, split: Split, cfg: LoaderConfig, device: torch.device, corrupt: CorruptLog | None = None):
        super().__init__(split, cfg, device, corrupt)
        self._skip = cfg.on_corrupt == "skip"
        files = _Files(split, transform(cfg.split, cfg.image_size), self._skip, cfg.split == "val")
        self._loader = torch.utils.data.DataLoader(
            files, batch_size=cfg.batch_size,
            sampler=_ShardSampler(self), num_workers=cfg.num_threads, drop_last=False,
            pin_memory=device.type == "cuda", persistent_workers=cfg.num_threads > 0,
            prefetch_factor=max(1, cfg.prefetch) if cfg.num_threads > 0 else None,
            worker_init_fn=_worker_seed(cfg.seed, cfg.rank) if cfg.num_threads > 0 else None,
            multiprocessing_context=_worker_context() if cfg.num_threads > 0 else None)

    def __iter__(self):
        it = iter(self._loader)
        for step in range(len(self)):
            try:
                x, y, *skipped = next(it)
            except DataError as e:
                # Raised in a worker, re-raised here with the worker's traceback: keep the one-line message.
                lines = [ln for ln in str(e).splitlines() if ln.strip()]
                msg = lines[-1].split("DataError: ", 1)[-1] if lines else str(e)
                raise DataError(msg) from None
            for note in skipped[0] if skipped else ():
                if note:
                    self.corrupt.note(*note.split("\t"))
            y = self._mark_padding(step, y.to(torch.int64))
            # copy the pinned batch as it is (asynchronous), then change the layout on the device
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            if self.cfg.channels_last or self.cfg.dtype != "float32":
                fmt = torch.channels_last if self.cfg.channels_last else torch.contiguous_format
                x = x.to(dtype=self.cfg.torch_dtype(), memory_format=fmt)  # one kernel for both
            yield x, y

    def close(self) -> None:
        it = getattr(self._loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
