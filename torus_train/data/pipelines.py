"""The file pipelines (data.loader): DALI, or the torchvision fallback, over a folder's or a packed set's split.
Torch, DALI and torchvision are imported when a loader is built."""

from __future__ import annotations

import sys

from torus_train.data.base import LoaderRequest
from torus_train.data.index import DataError, Split
from torus_train.errors import UserError
from torus_train.job.sources import DECODERS

KINDS = ("auto", "dali", "torchvision")
"""The file pipelines (data.loader): auto = dali when nvidia.dali imports, else torchvision."""
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
        msg = (
            "input pipeline: DALI"
            if chosen == "dali"
            else "input pipeline: torchvision (nvidia.dali is not importable; install nvidia-dali-cuda120 for DALI)"
        )
        (say or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)
        _said_auto = True
    return chosen


def file_loader(files: Split, request: LoaderRequest):
    """The file pipeline (request.pipeline: DALI, or torchvision) over ``files`` (a folder's or a packed set's
    split): what the folder, packed and demo sources open. The torchvision loader decodes where
    request.decoder's entry (job/sources.py: DECODERS) places it for the request's device; DALI decodes on
    the GPU ("mixed") whenever the device is one."""
    kind = resolve_kind(request.pipeline, request.cfg.rank)
    if kind == "dali":
        from torus_train.data.dali import DaliLoader, available

        if not available():
            raise UserError("data.loader: dali, but nvidia.dali does not import (pip install nvidia-dali-cuda120)")
        return DaliLoader(files, request.cfg, request.device, request.corrupt)
    from torus_train.data.torchvision_loader import TorchvisionLoader

    decoder = DECODERS.get(request.decoder).place(request.device.type)  # data.decoder: auto, cpu or gpu
    return TorchvisionLoader(files, request.cfg, request.device, request.corrupt, decoder)


def check_class_count(files: Split, num_classes: int | None, what: str) -> None:
    """A DataError when the set's classes (``what``: "class folders", "packed classes") are not the model's."""
    if num_classes and num_classes != len(files.classes):
        raise DataError(f"{files.root}: {len(files.classes)} {what}, but the model has {num_classes} classes")
