"""Input pipelines: DALI, the torchvision fallback, synthetic data, and the demo data set.

    from torus_train.data import make_loader
    loader = make_loader("auto", "/data/imagenet", "train", rank=rank, world_size=world, batch_size=32,
                         image_size=224, num_classes=1000, seed=0, channels_last=True, device=device)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader: ...

Every loader yields (images float32 [B,3,H,W] normalised with the ImageNet statistics, labels int64 [B]) on
``device``; ``len(loader)`` is the number of steps per epoch, the same on every rank. Training data is
sharded by GLOBAL rank and reshuffled per epoch; the shard is padded with wrapped-around real samples.
Validation data is read once across the ranks; padded samples carry label -1 (count only ``labels >= 0``).
Attributes: ``num_samples`` (data-set size), ``num_classes``, ``batch_size``, ``pad`` (padded samples in
this rank's shard this epoch), ``kind`` ("dali", "torchvision" or "synthetic"); ``close()`` frees workers.

This module imports torch lazily, inside make_loader.
"""
from __future__ import annotations

import sys

from torus_train.data.checks import DataError, scan  # noqa: F401  (pure)
from torus_train.data.sharding import shard  # noqa: F401  (pure)
from torus_train.errors import UserError

KINDS = ("auto", "dali", "torchvision", "synthetic")
_said_auto = False


def resolve_kind(kind: str, rank: int = 0, say=None) -> str:
    """``auto`` -> ``dali`` when nvidia.dali imports, else ``torchvision`` (said once, by rank 0)."""
    global _said_auto
    if kind not in KINDS:
        raise UserError(f"data.loader: {kind!r} is not one of {', '.join(KINDS)}")
    if kind != "auto":
        return kind
    from torus_train.data.dali import available

    chosen = "dali" if available() else "torchvision"
    if not _said_auto and rank == 0:
        msg = "input pipeline: DALI" if chosen == "dali" else \
            "input pipeline: torchvision (nvidia.dali is not importable; install nvidia-dali-cuda120 for DALI)"
        (say or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)
        _said_auto = True
    return chosen


def make_loader(kind: str, root, split: str, *, rank: int, world_size: int, batch_size: int, image_size: int,
                num_classes: int | None, seed: int, channels_last: bool, device, num_threads: int = 2,
                verify: bool = True, synthetic_samples: int | None = None, index: str | None = None,
                dtype: str = "float32", on_corrupt: str = "fail", corrupt=None, io_workers: int = 2,
                prefetch: int = 2, shuffle_buffer: int = 8192):
    """Build the input pipeline ``kind`` for ``split`` of ``root``: an ImageNet-layout folder or a packed set
    (``torus-train data pack``; told apart by its packed.json).

    ``kind``: dali | torchvision | synthetic | auto. ``batch_size`` is the PER-RANK batch; ``rank`` the GLOBAL
    rank. ``num_classes``: for folders, None or the expected count (an error if the folder has another);
    for synthetic data, the label range. ``index``: the folder's file index (data/index.py), opened as it is;
    None = its default place, built there when missing (single-process tools; ranks are always given one).
    ``verify`` checks every JPEG's markers before the first step (a full pass over the files: for tools, never
    for ranks). ``dtype``: the images' dtype (float32, float16,
    bfloat16), the model's autocast dtype on GPUs, so that no full-size float32 batch is made and cast.
    ``on_corrupt``: an image that does not decode is a DataError naming it (fail) or is replaced by the next
    readable file (skip); ``corrupt``: the base.CorruptLog that counts the skipped files (kept across the
    loaders of a run; a new one when None), also ``loader.corrupt``. ``io_workers``: reader threads;
    ``prefetch``: batches prepared ahead; ``shuffle_buffer``: a packed set's in-buffer shuffle (data/packed.py).
    """
    import torch

    cfg = loader_config(split, rank, world_size, batch_size, image_size, seed, channels_last, num_threads, dtype,
                        on_corrupt, io_workers, prefetch, shuffle_buffer)
    device = torch.device(device)
    kind = resolve_kind(kind, rank)
    if kind == "synthetic":
        from torus_train.data.synthetic import SYNTHETIC_SAMPLES, SyntheticLoader

        return SyntheticLoader(cfg, num_classes or 1000, device, synthetic_samples or SYNTHETIC_SAMPLES)
    if root is None:
        raise UserError(f"data.source: a data folder is needed for the {kind} loader")
    files = split_files(root, split, index, verify, num_classes)
    if kind == "dali":
        from torus_train.data.dali import DaliLoader, available

        if not available():
            raise UserError("data.loader: dali, but nvidia.dali does not import (pip install nvidia-dali-cuda120)")
        return DaliLoader(files, cfg, device, corrupt)
    from torus_train.data.torchvision_loader import TorchvisionLoader

    return TorchvisionLoader(files, cfg, device, corrupt)


def loader_config(split: str, rank: int, world_size: int, batch_size: int, image_size: int, seed: int,
                  channels_last: bool, num_threads: int, dtype: str, on_corrupt: str, io_workers: int,
                  prefetch: int, shuffle_buffer: int):
    """make_loader's arguments checked (UserError naming the field) and gathered into a base.LoaderConfig."""
    from torus_train.data.base import IMAGE_DTYPES, ON_CORRUPT, LoaderConfig

    if split not in ("train", "val"):
        raise UserError(f"split: {split!r} must be train or val")
    for name, v in (("batch_size", batch_size), ("image_size", image_size), ("world_size", world_size),
                    ("data.io_workers", io_workers), ("data.prefetch", prefetch),
                    ("data.shuffle_buffer", shuffle_buffer)):
        if not isinstance(v, int) or v < 1:
            raise UserError(f"{name}: {v!r} must be a positive integer")
    if not 0 <= rank < world_size:
        raise UserError(f"rank: {rank} outside world size {world_size}")
    if num_threads < 0:
        raise UserError(f"data.num_threads: {num_threads} must be >= 0")
    if dtype not in IMAGE_DTYPES:
        raise UserError(f"dtype: {dtype!r} must be one of {', '.join(IMAGE_DTYPES)}")
    if on_corrupt not in ON_CORRUPT:
        raise UserError(f"data.on_corrupt: {on_corrupt!r} must be one of {', '.join(ON_CORRUPT)}")
    return LoaderConfig(split, rank, world_size, batch_size, image_size, seed, channels_last, num_threads, dtype,
                        on_corrupt, io_workers, prefetch, shuffle_buffer)


def split_files(root, split: str, index: str | None, verify: bool, num_classes: int | None):
    """The files and labels of ``split``: from a packed set's index, or from the folder's file index (built at
    its default place when missing); every JPEG checked first when ``verify`` (folders only)."""
    from torus_train.data.index import ensure_index, load_index
    from torus_train.data.packed import is_packed, load_packed

    packed = is_packed(root)
    if packed:  # ranks open its index; the launcher checked the shards (packed.Packed.verify)
        files = load_packed(root).split(split)
    else:
        files = load_index(index or ensure_index(root, log=lambda m: print(m, file=sys.stderr)), root).split(split)
        if verify:
            from torus_train.data.checks import verify_files

            verify_files(files)
    if num_classes and num_classes != len(files.classes):
        what = "packed classes" if packed else "class folders"
        raise DataError(f"{files.root}: {len(files.classes)} {what}, but the model has {num_classes} classes")
    return files
