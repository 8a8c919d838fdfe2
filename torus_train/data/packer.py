"""`torus-train data pack`: a data set in any layout of data/layouts/ written as a packed set (numpy; no torch).

    torus-train data pack --data DIR --out SHARDS [--shard-mb 256] [--seed 0]

DIR is an ImageNet-layout folder, image-net.org's archives or Kaggle's layout: the same images pack into the
same set whatever the layout. The format written is data/packed.py's. Every image is checked by its content
first (data/checks.py: a PNG named .JPEG packs, a truncated file does not). The set is written beside ``--out``
and renamed in (outdir.py): a pack interrupted half-way leaves no folder that looks like a packed set, and every
file of the data set is listed and opened through the door (userfiles.py) before anything is written, so a FIFO
or a device among them is refused before the temporary folder exists.

The training split is written in a random order (seeded, ``--seed``), so every shard holds a mix of all
classes; validation keeps the folder's order.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import time
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from torus_train.data.checks import content_problem
from torus_train.data.index import SPLITS, DataError, arrays_checksum, resolve_data
from torus_train.data.layouts import find_layout, open_source
from torus_train.data.layouts.base import Listing, Source
from torus_train.data.packed import MARKER, SEED_MAX, SHARD_MB_RANGE, VERSION
from torus_train.errors import UserError, shown_path
from torus_train.job.sources import PACKED_FORMAT as FORMAT
from torus_train.job.sources import PACKED_KIND
from torus_train.outdir import check_target, resolve_target, write_folder

BLOCK = 512
"""A tar block: headers are one, a member's data is padded to a whole number of them."""
PROGRESS_SECONDS = 5.0
"""How often a pack says how far it got."""


def check_shard_mb(shard_mb: float, flag: str = "--shard-mb") -> None:
    low, high = SHARD_MB_RANGE
    if not low <= shard_mb <= high:
        raise UserError(f"{flag}: {shard_mb:g} must be between {low:g} and {high:,.0f} (MB per shard; 256 is usual)")


def check_pack_target(data: Path, out: str | os.PathLike, flag: str = "--out") -> Path:
    """The pack target, refused before any work when it holds something that is not a packed set, or when it
    is the data folder, holds it, or lies inside it (it would be read as a class)."""
    dest = resolve_target(out, flag)
    if dest == data or dest in data.parents:
        raise UserError(f"{flag} {shown_path(dest)}: holds the data folder {shown_path(data)}; give a new folder")
    if data in dest.parents:
        raise UserError(
            f"{flag} {shown_path(dest)}: inside the data folder {shown_path(data)}; put the packed set elsewhere"
        )
    check_target(dest, PACKED_KIND, flag)
    return dest


def _tar_header(name: str, size: int) -> bytes:
    """A ustar header for a regular file (fixed mode, owner and mtime, so a pack is byte-for-byte repeatable)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o444, 0
    return info.tobuf(format=tarfile.USTAR_FORMAT)


class _ShardWriter:
    """Writes one split's shards under ``folder``: records, cut at ``limit`` bytes, hashed as written."""

    def __init__(self, folder: Path, split: str, limit: int):
        self.folder, self.split, self.limit = folder, split, limit
        self.shards: list[dict] = []
        self.starts: list[int] = [0]
        self.f: BinaryIO | None = None
        self.pos = 0
        self.count = 0

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):06d}.tar"
        self.f = open(self.folder / name, "wb")  # noqa: SIM115 - held across add() calls; _close() closes it
        self.hash = hashlib.sha256()
        self.pos = 0
        self.shards.append({"name": name, "bytes": 0, "samples": 0, "sha256": ""})

    def _write(self, b: bytes) -> None:
        assert self.f is not None  # add() opens a shard before it writes
        self.f.write(b)
        self.hash.update(b)
        self.pos += len(b)

    def _member(self, name: str, payload: bytes) -> int:
        self._write(_tar_header(name, len(payload)))
        at = self.pos
        self._write(payload)
        self._write(b"\0" * (-len(payload) % BLOCK))
        return at

    def add(self, key: str, ext: str, image: bytes, label: int) -> int:
        """Append a sample; the offset of its image bytes in its shard."""
        record = 3 * BLOCK + len(image) + BLOCK  # two headers, the padded image, the padded label
        if self.f is None or (self.pos + record > self.limit and self.shards[-1]["samples"]):
            self._close()
            self._open()
        at = self._member(f"{key}.{ext}", image)
        self._member(f"{key}.cls", str(label).encode())
        self.shards[-1]["samples"] += 1
        self.count += 1
        return at

    def _close(self) -> None:
        if self.f is None:
            return
        self._write(b"\0" * (2 * BLOCK))  # the tar end-of-archive marker
        self.f.close()
        self.f = None
        self.shards[-1].update(bytes=self.pos, sha256=self.hash.hexdigest())
        self.starts.append(self.count)

    def finish(self) -> tuple[list[dict], np.ndarray]:
        self._close()
        return self.shards, np.asarray(self.starts, dtype=np.int64)


def _checked(where: str, name: str, data: bytes) -> bytes:
    """The image bytes of ``name`` (CLASS/FILE), refused (DataError naming ``where``) when no decoder reads them:
    judged by content, so a PNG named .JPEG packs and a truncated file does not."""
    problem = content_problem(data)
    if problem:
        raise DataError(f"{where}: {problem}; fix or remove it, then pack again (torus-train data check lists all)")
    return data


def _pack_split(
    listing: Listing, classes: tuple[str, ...], split: str, tmp: Path, limit: int, seed: int, log
) -> tuple[dict, dict]:
    names, labels = listing.names, listing.labels
    n = len(names)
    # training samples in a seeded random order: every shard then holds a mix of the classes
    order = np.random.Generator(np.random.PCG64([seed])).permutation(n) if split == "train" else np.arange(n)
    w = _ShardWriter(tmp, split, limit)
    arrays = {
        k: np.zeros(n, dtype=t)
        for k, t in (("offsets", np.int64), ("sizes", np.int64), ("labels", np.int32), ("crc32", np.uint32))
    }
    progress = _Progress(split, n, log)
    for k, i in enumerate(order):
        image = _checked(listing.where(i), names[i], listing.read(i))
        ext = os.path.splitext(names[i])[1].lower().lstrip(".") or "img"
        ext = "jpg" if ext == "jpeg" else ext
        arrays["offsets"][k] = w.add(f"{k:08d}", ext, image, labels[i])
        arrays["sizes"][k], arrays["labels"][k], arrays["crc32"][k] = len(image), labels[i], zlib.crc32(image)
        progress(k + 1, len(image))
    shards, starts = w.finish()
    arrays["starts"] = starts
    return {"classes": list(classes), "count": n, "shards": shards}, arrays


class _Progress:
    """A line every PROGRESS_SECONDS: samples packed, MB, rate and time left (a pack of ImageNet takes hours)."""

    def __init__(self, split: str, total: int, log):
        self.split, self.total, self.log = split, total, log
        self.t0 = self.last = time.time()
        self.bytes = 0

    def __call__(self, done: int, size: int) -> None:
        self.bytes += size
        now = time.time()
        if self.log and now - self.last > PROGRESS_SECONDS:
            self.last = now
            rate = done / max(now - self.t0, 1e-9)
            left = (self.total - done) / max(rate, 1e-9)
            self.log(
                f"  {self.split}: {done:,}/{self.total:,} samples ({100 * done / max(self.total, 1):.1f}%), "
                f"{self.bytes / 1e6:,.0f} MB, {rate:,.0f} samples/s, {_duration(left)} left"
            )


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def pack(
    data_root: str | os.PathLike,
    out: str | os.PathLike,
    shard_mb: float = 256,
    seed: int = 0,
    log=None,
    flag: str = "--out",
) -> Path:
    """Pack the data set at ``data_root`` (in any of the layouts of data/layouts/) into ``out`` (written beside
    it and renamed in: a pack interrupted half-way leaves no folder that looks like a packed set); the packed
    set's folder."""
    check_shard_mb(shard_mb)
    if not (isinstance(seed, int) and 0 <= seed <= SEED_MAX):
        raise UserError(f"--seed: {seed} must be between 0 and 2**63-1 (it seeds the training samples' order)")
    data = resolve_data(data_root)
    layout = find_layout(data)  # by file names: a missing part is named before anything is read
    dest = check_pack_target(data, out, flag)
    t0 = time.time()
    source = open_source(data, log, layout)  # lists both splits; refuses an empty one
    try:
        meta = _write_packed(source, dest, shard_mb, seed, log, flag, t0)
    finally:
        source.close()
    meta["seconds"] = round(time.time() - t0, 3)
    if log:
        counts = ", ".join(
            f"{s} {m['count']:,} samples in {len(m['shards'])} shards" for s, m in meta["splits"].items()
        )
        log(f"packed {data}: {counts}, {meta['bytes'] / 1e6:,.1f} MB in {meta['seconds']:.1f} s -> {dest}")
    return dest


def _write_packed(source: Source, dest: Path, shard_mb: float, seed: int, log, flag: str, t0: float) -> dict:
    """Write the shards, the index arrays and packed.json of ``source`` into ``dest`` (``t0``: when the pack
    started, listing included); packed.json's content."""
    limit = max(4 * BLOCK, int(shard_mb * 1e6))
    meta: dict = {
        "format": FORMAT,
        "version": VERSION,
        "source": str(source.root),
        "layout": source.layout,
        "seed": seed,
        "shard_mb": shard_mb,
        "splits": {},
    }
    if source.class_names is not None:
        meta["class_names"] = list(source.class_names)

    def fill(tmp: Path) -> None:
        arrays = {}
        for split in SPLITS:
            meta["splits"][split], a = _pack_split(source.splits[split], source.classes, split, tmp, limit, seed, log)
            arrays.update({f"{split}.{k}": v for k, v in a.items()})
        for key, a in arrays.items():
            np.save(tmp / f"{key}.npy", a)
        meta["checksum"] = arrays_checksum(arrays)
        meta["bytes"] = sum(s["bytes"] for sp in meta["splits"].values() for s in sp["shards"])
        meta["seconds"] = round(time.time() - t0, 3)  # packed.json's figure; the summary line's includes the rename
        (tmp / MARKER).write_text(json.dumps(meta, indent=1))  # last: a folder without it is no packed set

    try:
        write_folder(dest, PACKED_KIND, flag, fill)
    except OSError as e:
        raise DataError(f"{dest}: cannot write the packed set ({e.strerror or e})") from None
    return meta
