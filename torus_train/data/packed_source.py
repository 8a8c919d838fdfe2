"""The packed data source (its entry is ``packed`` in job/sources.py): what the launcher, the preflight, `data
check` and every rank ask of a packed set (data/packed.py is the format itself)."""

from __future__ import annotations

from torus_train.data.packed import check_shards, load_packed, split_classes
from torus_train.data.pipelines import check_class_count, file_loader
from torus_train.data.sweep import SweepReport, packed_chunks, sweep
from torus_train.job.sources import CheckRequest


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


def check_files(request: CheckRequest) -> SweepReport:
    """`torus-train data check`: the index and every shard's SHA-256 (all splits: shards hold one each, and a
    pack admitted only files that pass the content check); with ``decode`` also every sample decoded whole on
    the sweep's process pool."""
    packed = load_packed(request.root)
    check_shards(packed)
    request.echo(f"{request.root}: packed set, {len(packed.shard_files())} shards, checksums match")
    total = SweepReport(request.decode, request.workers)
    if not request.decode:
        total.files = sum(len(packed.split(s)) for s in request.splits)
        return total
    for split in request.splits:
        sp = packed.split(split)
        progress = request.progress(str(sp.root)) if request.progress else None
        chunks = packed_chunks(str(packed.path), split, len(sp))
        r = sweep(chunks, len(sp), True, request.workers, progress)
        bad = f"{r.bad:,} will not train" if r.bad else "all decode"
        echo = request.echo
        echo(f"{sp.root}: {len(sp.classes)} classes, {len(sp):,} samples, {bad} ({r.seconds:.1f} s, {r.rate()})")
        total.add(r)
    return total
