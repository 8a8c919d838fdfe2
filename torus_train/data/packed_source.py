"""The packed data source (its entry is ``packed`` in job/sources.py): what the launcher, the preflight, `data
check` and every rank ask of a packed set (data/packed.py is the format itself)."""

from __future__ import annotations

from torus_train.data.packed import check_shards, load_packed, split_classes
from torus_train.data.pipelines import check_class_count, file_loader


def open_loader(request):
    """The loader of a packed split (request.root: the set, or its node-local copy): its index opened
    memory-mapped (the launcher checked the shards: Packed.verify), read by DALI or torchvision."""
    files = load_packed(request.root).split(request.cfg.split)
    check_class_count(files, request.num_classes, "packed classes")
    return file_loader(files, request)


def classes(spec) -> tuple[str, dict]:
    """The preflight's view: each split's classes, from packed.json."""
    return str(spec.data.source), split_classes(spec.data.source)


def prepare(spec, log=None) -> None:
    """Before any rank starts: the index checked whole and every shard's size (one stat per shard)."""
    load_packed(spec.data.source).verify()


def check_files(root, splits, location, echo) -> None:
    """`torus-train data check`: the index and every shard's SHA-256 (all splits: shards hold one each)."""
    packed = load_packed(root)
    check_shards(packed)
    echo(f"{root}: packed set, {len(packed.shard_files())} shards, checksums match")
