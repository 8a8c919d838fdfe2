"""Input pipelines: the loaders of the data sources (job/sources.py), DALI and the torchvision fallback.

A rank opens its loader through its data source's entry (train/build.py); tools open one directly:

    from torus_train.data import make_loader
    loader = make_loader("auto", "/data/imagenet", "train", rank=rank, world_size=world, batch_size=32,
                         image_size=224, num_classes=1000, seed=0, channels_last=True, device=device)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader: ...

Every loader keeps the contract data.base.Loader (batches on the device, ``len`` equal on every rank,
training sharded by GLOBAL rank and reshuffled per epoch, validation padded with label -1, ``close()``).

This module imports torch lazily, inside the functions that build loaders.
"""

from __future__ import annotations

from torus_train.data.base import IMAGE_DTYPES, ON_CORRUPT, LoaderConfig, LoaderRequest
from torus_train.data.checks import DataError, scan  # noqa: F401  (pure)
from torus_train.data.pipelines import KINDS, resolve_kind  # noqa: F401
from torus_train.data.sharding import shard  # noqa: F401  (pure)
from torus_train.errors import UserError
from torus_train.job.sources import SOURCES, path_source


def make_loader(
    kind: str,
    root,
    split: str,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    image_size: int,
    num_classes: int | None,
    seed: int,
    channels_last: bool,
    device,
    num_threads: int = 2,
    verify: bool = True,
    synthetic_samples: int | None = None,
    index: str | None = None,
    dtype: str = "float32",
    on_corrupt: str = "fail",
    corrupt=None,
    io_workers: int = 2,
    prefetch: int = 2,
    shuffle_buffer: int = 8192,
    decoder: str = "auto",
):
    """A loader for ``split`` of ``root`` (tools and tests; ranks go through train/build.py): ``root`` is a
    folder or a packed set, told apart by the data sources' table; or ``kind`` names a data source that takes
    no path (synthetic, demo) and ``root`` is None.

    ``kind``: dali | torchvision | auto (the file pipeline), or such a source's name. The other arguments are
    the fields of base.LoaderConfig (``batch_size`` PER-RANK, ``rank`` GLOBAL; checked by ``loader_config``) and
    of base.LoaderRequest, each documented there; here the index is built at its default place when missing,
    ``verify`` (a full pass over the files before the first step) is on, and ``corrupt`` is also
    ``loader.corrupt`` (a new base.CorruptLog when None).
    """
    import torch

    cfg = loader_config(
        split,
        rank,
        world_size,
        batch_size,
        image_size,
        seed,
        channels_last,
        num_threads,
        dtype,
        on_corrupt,
        io_workers,
        prefetch,
        shuffle_buffer,
    )
    named = kind in SOURCES and not SOURCES.get(kind).takes_path
    request = LoaderRequest(
        cfg, torch.device(device), None if named else root, "auto" if named else kind, num_classes, index,
        build_index=True, verify=verify, samples=synthetic_samples or 0, corrupt=corrupt, decoder=decoder,
    )  # fmt: skip
    return _open(kind, root, request, named)


def _open(kind: str, root, request: LoaderRequest, named: bool):
    """The loader of the source ``kind`` names (no path), or of the folder or packed set at ``root``."""
    if named:
        return SOURCES.get(kind).open_loader(request)
    if kind not in KINDS:  # named before the folder is read
        raise UserError(f"data.loader: {kind!r} is not one of {', '.join(KINDS)}")
    if root is None:
        raise UserError(f"data.source: a data folder is needed for the {kind} loader")
    return path_source(root).open_loader(request)


def loader_config(
    split: str,
    rank: int,
    world_size: int,
    batch_size: int,
    image_size: int,
    seed: int,
    channels_last: bool,
    num_threads: int,
    dtype: str,
    on_corrupt: str,
    io_workers: int,
    prefetch: int,
    shuffle_buffer: int,
):
    """make_loader's arguments checked (UserError naming the field) and gathered into a base.LoaderConfig."""
    if split not in ("train", "val"):
        raise UserError(f"split: {split!r} must be train or val")
    for name, v in (
        ("batch_size", batch_size),
        ("image_size", image_size),
        ("world_size", world_size),
        ("data.io_workers", io_workers),
        ("data.prefetch", prefetch),
        ("data.shuffle_buffer", shuffle_buffer),
    ):
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
    return LoaderConfig(
        split,
        rank,
        world_size,
        batch_size,
        image_size,
        seed,
        channels_last,
        num_threads,
        dtype,
        on_corrupt,
        io_workers,
        prefetch,
        shuffle_buffer,
    )
