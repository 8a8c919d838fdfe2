"""The torchvision fallback: PIL decoding in DataLoader worker processes, with the DALI path's semantics.

The files and labels are ImageFolder's (sorted class folders); the order is the same per-epoch sharding rule
as DALI's (checks.shard: a DistributedSampler-like permutation, padded to whole batches so every rank takes
the same steps). Training: RandomResizedCrop + RandomHorizontalFlip; validation: Resize(size / 0.875) +
CenterCrop; then ToTensor + Normalize with the ImageNet statistics.
"""
from __future__ import annotations

import torch
from PIL import Image

from torus_train.data.base import MEAN, STD, TRAIN_AREA, TRAIN_RATIO, LoaderConfig, ShardedLoader, val_resize
from torus_train.data.index import DataError, Split


def transform(split: str, image_size: int):
    """The torchvision transform for ``split``."""
    from torchvision import transforms as T

    if split == "train":
        ops = [T.RandomResizedCrop(image_size, scale=TRAIN_AREA, ratio=TRAIN_RATIO), T.RandomHorizontalFlip()]
    else:
        ops = [T.Resize(val_resize(image_size)), T.CenterCrop(image_size)]
    return T.Compose(ops + [T.ToTensor(), T.Normalize(MEAN, STD)])


class _Files(torch.utils.data.Dataset):
    def __init__(self, split: Split, tf):
        self.files, self.labels, self.tf = split.files, split.labels, tf

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path = self.files[i]
        try:
            with Image.open(path) as im:
                img = im.convert("RGB")
        except Exception as e:  # PIL raises several types for bad files
            raise DataError(f"{path}: cannot decode ({type(e).__name__}: {e})") from None
        return self.tf(img), self.labels[i]


class _ShardSampler(torch.utils.data.Sampler):
    """Yields the loader's current shard (set_epoch swaps it; the DataLoader asks again each pass)."""

    def __init__(self, owner: "TorchvisionLoader"):
        self.owner = owner

    def __iter__(self):
        return iter(self.owner.shard.indices)

    def __len__(self) -> int:
        return len(self.owner.shard.indices)


def _worker_seed(seed: int, rank: int):
    def init(worker_id: int) -> None:
        torch.manual_seed(seed * 7919 + rank * 104729 + worker_id * 31 + torch.initial_seed() % 1000003)
    return init


class TorchvisionLoader(ShardedLoader):
    """Iterates (images [B,3,H,W] in cfg.dtype, labels int64 [B]) on ``device`` through a DataLoader."""

    kind = "torchvision"

    def __init__(self, split: Split, cfg: LoaderConfig, device: torch.device):
        super().__init__(split, cfg, device)
        self._loader = torch.utils.data.DataLoader(
            _Files(split, transform(cfg.split, cfg.image_size)), batch_size=cfg.batch_size,
            sampler=_ShardSampler(self), num_workers=cfg.num_threads, drop_last=False,
            pin_memory=device.type == "cuda", persistent_workers=cfg.num_threads > 0,
            prefetch_factor=4 if cfg.num_threads > 0 else None,
            worker_init_fn=_worker_seed(cfg.seed, cfg.rank) if cfg.num_threads > 0 else None)

    def __iter__(self):
        it = iter(self._loader)
        for step in range(len(self)):
            try:
                x, y = next(it)
            except DataError as e:
                # Raised in a worker, re-raised here with the worker's traceback: keep the one-line message.
                lines = [ln for ln in str(e).splitlines() if ln.strip()]
                msg = lines[-1].split("DataError: ", 1)[-1] if lines else str(e)
                raise DataError(msg) from None
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
