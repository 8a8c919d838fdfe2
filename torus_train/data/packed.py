"""Packed data sets: the train and val splits as tar shards in WebDataset's layout, with an index (numpy; no torch).

    torus-train data pack --data DIR --out SHARDS [--shard-mb 256]

DIR is an ImageNet-layout folder, image-net.org's archives or Kaggle's layout (data/layouts.py): the same
images pack into the same set whatever the layout.

A packed set is a folder:

    packed.json                          format, version, source folder and its layout, per split: classes,
                                         count, shards (name, bytes, samples, sha256); the arrays' checksum;
                                         class_names (classes[i]'s words) where the layout gives them
    train-000000.tar, ...                shard k of train: KEY.jpg (the encoded image, as it was in the folder)
    val-000000.tar, ...                  and KEY.cls (its label, decimal ASCII), KEY = the sample's number
    train.starts.npy, val.starts.npy     the first sample of each shard (int64, shards + 1 entries)
    train.offsets.npy, ...               where each sample's image bytes start in its shard (int64)
    train.sizes.npy, ...                 the image's length in bytes (int64)
    train.labels.npy, ...                its label (int32; classes sorted, as the folder's index)
    train.crc32.npy, ...                 the image bytes' CRC-32 (uint32): an altered shard is named per sample

Any WebDataset reader reads the tar files (their members are plain ustar entries, KEY.jpg then KEY.cls).
torus-train's ranks never list anything: they open the index arrays memory-mapped and read a sample with one
``pread`` at its offset from a shard file they keep open, so a rank opens each shard it reads once (per reader
process), not each image.

The training split is written in a random order (seeded, ``--seed``), so every shard holds a mix of all
classes; see ``epoch_order`` for how an epoch reads it. Validation keeps the folder's order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tarfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from torus_train.data.checks import content_problem
from torus_train.data.index import (
    SPLITS,
    DataError,
    Split,
    arrays_checksum,
    check_class_names,
    load_arrays,
    resolve_data,
)
from torus_train.data.layouts import Listing, Source, find_layout
from torus_train.errors import UserError, shown_path
from torus_train.job.sources import PACKED_FORMAT as FORMAT
from torus_train.job.sources import PACKED_KIND
from torus_train.outdir import check_target, resolve_target, write_folder
from torus_train.userfiles import Field, check, read_json

VERSION = 1
MARKER = PACKED_KIND.marker
ARRAYS = {"starts": np.int64, "offsets": np.int64, "sizes": np.int64, "labels": np.int32, "crc32": np.uint32}
"""Each split's index arrays and their dtypes (all one-dimensional)."""
SHARD_MB_RANGE = (0.01, 65536.0)  # 10 KB (tests) to 64 GiB; 256 MB is WebDataset's and DALI's usual size
SEED_MAX = 2**63 - 1
BLOCK = 512
PROGRESS_SECONDS = 5.0
"""How often a pack says how far it got."""
SHARD_NAME = re.compile(rf"({'|'.join(SPLITS)})-[0-9]{{6}}\.tar")
"""The name of every shard a pack writes: SPLIT-NNNNNN.tar."""

META_FIELDS = (
    Field("format", "str", choices=(FORMAT,)),
    Field("version", "int"),
    Field("source", "str"),
    Field("checksum", "str"),
    Field("bytes", "int", 0),
    Field("seed", "int", 0, SEED_MAX, optional=True),
    Field("layout", "str", optional=True),
    Field("class_names", "list", optional=True),
    Field("shard_mb", "number", SHARD_MB_RANGE[0], SHARD_MB_RANGE[1], optional=True),
    *(
        f
        for s in SPLITS
        for f in (
            Field(f"splits.{s}.classes", "list"),
            Field(f"splits.{s}.count", "int", 0),
            Field(f"splits.{s}.shards", "list"),
        )
    ),
)
"""What packed.json holds (every field a reader uses), checked wherever a packed set is opened."""
SHARD_FIELDS = (Field("name", "str"), Field("bytes", "int", 0), Field("samples", "int", 0), Field("sha256", "str"))
"""One entry of splits.SPLIT.shards."""


def is_packed(path: str | os.PathLike | None) -> bool:
    """True when ``path`` is a packed set (its packed.json is one of ours)."""
    return path is not None and PACKED_KIND.holds(Path(path))


# --------------------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------------------
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
    """Pack the data set at ``data_root`` (in any of the layouts of data/layouts.py) into ``out`` (written beside
    it and renamed in: a pack interrupted half-way leaves no folder that looks like a packed set); the packed
    set's folder."""
    check_shard_mb(shard_mb)
    if not (isinstance(seed, int) and 0 <= seed <= SEED_MAX):
        raise UserError(f"--seed: {seed} must be between 0 and 2**63-1 (it seeds the training samples' order)")
    data = resolve_data(data_root)
    layout = find_layout(data)  # by file names: a missing part is named before anything is read
    dest = check_pack_target(data, out, flag)
    t0 = time.time()
    source = layout.open(data, log)
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


# --------------------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------------------
class SampleNames:
    """``names[i]``: SHARD.tar:KEY, how messages name sample i of a packed split."""

    def __init__(self, split: PackedSplit):
        self.split = split

    def __len__(self) -> int:
        return len(self.split.labels)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = int(i)
        return f"{self.split.shard_paths[self.split.shard_of(i)]}:{i:08d}"


@dataclass(frozen=True)
class PackedSplit(Split):
    """One split of a packed set: ``files[i]`` names sample i (SHARD.tar:KEY); the arrays locate its bytes."""

    shard_paths: tuple[str, ...] = ()
    """Absolute path of each shard."""
    shard_bytes: tuple[int, ...] = ()
    """Each shard's size as packed."""
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    """First sample of each shard (shards + 1 entries)."""
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    crc32: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    class_names: tuple[str, ...] = ()
    """classes[i]'s words where the packed layout gave them (image-net.org's meta.mat, Kaggle's synset mapping)."""

    def shard_of(self, i: int) -> int:
        return int(np.searchsorted(self.starts, i, side="right")) - 1


@dataclass(frozen=True)
class Packed:
    """A loaded packed set: packed.json and the memory-mapped arrays."""

    path: Path
    meta: dict
    arrays: dict[str, np.ndarray]

    def split(self, name: str) -> PackedSplit:
        s = self.meta["splits"][name]
        a = {k: self.arrays[f"{name}.{k}"] for k in ARRAYS}
        sp = PackedSplit(
            self.path / name,
            tuple(s["classes"]),
            (),
            a["labels"],
            tuple(str(self.path / sh["name"]) for sh in s["shards"]),
            tuple(int(sh["bytes"]) for sh in s["shards"]),
            a["starts"],
            a["offsets"],
            a["sizes"],
            a["crc32"],
            tuple(self.meta.get("class_names") or ()),
        )
        object.__setattr__(sp, "files", SampleNames(sp))
        return sp

    @property
    def bytes(self) -> int:
        return int(self.meta["bytes"])

    def classes(self) -> dict[str, tuple[str, ...]]:
        """Each split's classes (label i is classes[i])."""
        return {s: tuple(m["classes"]) for s, m in self.meta["splits"].items()}

    def shard_files(self) -> list[tuple[str, int, str]]:
        """(name, bytes, sha256) of every shard."""
        return [
            (sh["name"], int(sh["bytes"]), sh["sha256"]) for m in self.meta["splits"].values() for sh in m["shards"]
        ]

    def verify(self) -> None:
        """The arrays match their checksum, say what packed.json says (labels within the classes, shards
        starting where their sample counts put them) and every shard is a regular file of its packed size
        (one stat per shard): the launcher's check before any rank starts."""
        if arrays_checksum(self.arrays) != self.meta["checksum"]:
            raise DataError(f"{self.path}: packed set's index is damaged (checksum differs); pack it again")
        for s in SPLITS:
            m, labels, starts = self.meta["splits"][s], self.arrays[f"{s}.labels"], self.arrays[f"{s}.starts"]
            if len(labels) and (labels.min() < 0 or labels.max() >= len(m["classes"])):
                raise DataError(
                    f"{self.path}: {s}.labels.npy holds labels outside the {len(m['classes'])} "
                    f"classes of {MARKER}; pack the set again"
                )
            if starts.tolist() != np.concatenate(([0], np.cumsum([sh["samples"] for sh in m["shards"]]))).tolist():
                raise DataError(
                    f"{self.path}: {s}.starts.npy does not match the shards' samples in {MARKER}; pack the set again"
                )
        for name, size, _ in self.shard_files():
            try:
                st = (self.path / name).stat()
            except OSError as e:
                raise DataError(f"{self.path / name}: {e.strerror or e} (a shard of the packed set)") from None
            if not stat.S_ISREG(st.st_mode):
                raise DataError(
                    f"{self.path / name}: not a regular file (a shard of the packed set); pack the set again"
                )
            if st.st_size != size:
                raise DataError(
                    f"{self.path / name}: {st.st_size:,} bytes, packed as {size:,} (truncated or "
                    f"replaced); pack the set again"
                )


def check_shards(packed: Packed) -> None:
    """``data check`` on a packed set: the index, and every shard's SHA-256 against packed.json (reads it all)."""
    packed.verify()
    for name, _, sha in packed.shard_files():
        h = hashlib.sha256()
        with open(packed.path / name, "rb") as f:
            for block in iter(lambda: f.read(8 << 20), b""):
                h.update(block)
        if h.hexdigest() != sha:
            raise DataError(f"{packed.path / name}: its bytes differ from those packed (SHA-256); pack the set again")


def load_packed(path: str | os.PathLike) -> Packed:
    """Open a packed set's index memory-mapped; DataError (one line naming the file and the field) when it is
    not one, of another version, or its packed.json or an array is not as a pack writes it."""
    p = Path(path)
    if not (p / MARKER).exists():
        raise DataError(
            f"{p}: not a packed set ({MARKER} missing); pack one with: torus-train data pack --data DIR --out {p}"
        )
    try:
        meta = read_json(p / MARKER, "packed set")
        if not isinstance(meta, dict) or not PACKED_KIND.recognise(meta):
            raise DataError(f"{p / MARKER}: not a torus-train packed set's")
        if meta.get("version") != VERSION:
            raise DataError(f"{p}: packed set version {str(meta.get('version'))[:20]} is not {VERSION}")
        check_meta(meta, f"{p / MARKER}")
        counts = {s: meta["splits"][s]["count"] for s in SPLITS}
        shards = {s: len(meta["splits"][s]["shards"]) for s in SPLITS}
        lengths = {k: (lambda s: shards[s] + 1) if k == "starts" else (lambda s: counts[s]) for k in ARRAYS}
        arrays = load_arrays(p, ARRAYS, lengths)
    except UserError as e:
        raise DataError(f"{e}; pack the set again") from None
    return Packed(p, meta, arrays)


def check_meta(meta: dict, where: str) -> None:
    """packed.json's fields: types and ranges (userfiles.check), unique string class names, every shard entry
    (a name as a pack writes it, sizes, a SHA-256), and the sums that tie them together."""
    check(meta, META_FIELDS, where)
    for s in SPLITS:
        m = meta["splits"][s]
        check_class_names(m["classes"], f"{where}: splits.{s}.classes")
        for i, sh in enumerate(m["shards"]):
            at = f"{where}: splits.{s}.shards[{i}]"
            check(sh, SHARD_FIELDS, at)
            if not SHARD_NAME.fullmatch(sh["name"]) or not sh["name"].startswith(f"{s}-"):
                raise DataError(f"{at}.name: {sh['name'][:40]!r} is not a {s} shard's name ({s}-NNNNNN.tar)")
            if not re.fullmatch("[0-9a-f]{64}", sh["sha256"]):
                raise DataError(f"{at}.sha256: {sh['sha256'][:70]!r} is not a SHA-256 (64 hex digits)")
        if sum(sh["samples"] for sh in m["shards"]) != m["count"]:
            raise DataError(f"{where}: splits.{s}: its shards' samples do not add up to count {m['count']}")
    names = meta.get("class_names")
    if names is not None and (
        len(names) != len(meta["splits"]["train"]["classes"]) or not all(isinstance(t, str) for t in names)
    ):
        raise DataError(f"{where}: class_names: must be one string per class of splits.train.classes")
    if sum(sh["bytes"] for s in SPLITS for sh in meta["splits"][s]["shards"]) != meta["bytes"]:
        raise DataError(f"{where}: bytes: {meta['bytes']} is not the sum of the shards' bytes")


def own_files(meta: dict) -> list[str]:
    """The files a pack writes beside packed.json: the index arrays and the shards its packed.json lists (only
    names a pack gives: a listed name that is not a shard's never makes a user's file the writer's own)."""
    shards = [sh["name"] for m in meta["splits"].values() for sh in m["shards"]]
    return [f"{s}.{k}.npy" for s in SPLITS for k in ARRAYS] + [
        n for n in shards if isinstance(n, str) and SHARD_NAME.fullmatch(n)
    ]


def split_classes(path: str | os.PathLike) -> dict[str, tuple[str, ...]]:
    """{"train": classes, "val": classes} of a packed set, from packed.json alone (for preflight checks)."""
    return load_packed(path).classes()


class ShardReader:
    """Reads sample i of a packed split with one pread from a shard file kept open (at most ``keep`` open).

    Thread-safe (pread has no file position; the table of open files is locked) and fork-safe: a process
    forked from the one that opened the files (torchvision's workers) opens its own.
    ``read`` returns (bytes, None) or (bytes or None, why the sample is unusable).
    """

    def __init__(self, split: PackedSplit, keep: int = 16):
        self.split, self.keep = split, keep
        self._fds: dict[int, int] = {}
        self._busy: dict[int, int] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.opens = 0

    def __getstate__(self):
        return {"split": self.split, "keep": self.keep}

    def __setstate__(self, state):
        self.__init__(state["split"], state["keep"])

    def _acquire(self, k: int) -> int:
        """The open descriptor of shard k, marked busy (never closed while a thread reads from it)."""
        with self._lock:
            if self._pid != os.getpid():  # forked: leave the parent's descriptors alone, open our own
                self._fds, self._busy, self._pid = {}, {}, os.getpid()
            fd = self._fds.pop(k, None)
            if fd is None:
                idle = [j for j in self._fds if not self._busy.get(j)]
                if len(self._fds) >= self.keep and idle:
                    os.close(self._fds.pop(idle[0]))  # least recently used idle shard
                fd = os.open(self.split.shard_paths[k], os.O_RDONLY)
                self.opens += 1
            self._fds[k] = fd  # most recently used last
            self._busy[k] = self._busy.get(k, 0) + 1
            return fd

    def _release(self, k: int) -> None:
        with self._lock:
            self._busy[k] -= 1

    def read(self, i: int) -> tuple[np.ndarray | None, str | None]:
        sp = self.split
        k = sp.shard_of(i)
        off, size = int(sp.offsets[i]), int(sp.sizes[i])
        try:
            fd = self._acquire(k)
        except OSError as e:
            return None, f"cannot read shard {sp.shard_paths[k]} ({e.strerror or e})"
        data = np.empty(size, dtype=np.uint8)  # read straight into the array DALI gets: no bytes object, no copy
        try:
            got = os.preadv(fd, [data], off)  # type: ignore[list-item]  # numpy tells type checkers of its buffer protocol only for Python 3.12+
        except OSError as e:
            return None, f"cannot read shard {sp.shard_paths[k]} ({e.strerror or e})"
        finally:
            self._release(k)
        if got < size:
            return None, (
                f"truncated shard: {got} of {size} bytes at offset {off:,} (the shard was packed "
                f"with {sp.shard_bytes[k]:,} bytes); pack the set again"
            )
        if zlib.crc32(data) != int(sp.crc32[i]):  # type: ignore[arg-type]  # numpy tells type checkers of its buffer protocol only for Python 3.12+
            return None, "altered shard: the sample's bytes differ from the packed ones (CRC-32); pack the set again"
        return data, None

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                for fd in self._fds.values():
                    os.close(fd)
            self._fds = {}

    def __del__(self):  # a dropped loader's reader: nobody reads with it any more
        try:
            self.close()
        except Exception:
            pass


# --------------------------------------------------------------------------------------------------------
# the order of an epoch
# --------------------------------------------------------------------------------------------------------
def epoch_order(starts: np.ndarray, epoch: int, seed: int, buffer: int) -> np.ndarray:
    """The training order of a packed split in ``epoch``: shard units, then an in-buffer shuffle.

    The shards are put in a random order drawn from (seed, epoch); their samples follow each other in that
    order; then each run of ``buffer`` consecutive samples is permuted (a block shuffle, vectorised; a
    sample moves at most ``buffer`` places). The result is a permutation of all samples, the same on every
    rank, so cutting it into equal contiguous shards (data/sharding.py) keeps exactly-once per epoch; and
    rank r's part is a run of whole shards (plus two partial ones at its ends), so a rank reads few shards.
    """
    n = int(starts[-1])
    rng = np.random.Generator(np.random.PCG64([seed, epoch, 0x5A4D]))
    perm = rng.permutation(len(starts) - 1)
    lengths = np.diff(starts)[perm]
    first = np.repeat(starts[:-1][perm] - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    seq = first + np.arange(n, dtype=np.int64)
    keys = (np.arange(n) // max(1, buffer)).astype(np.float64) + rng.random(n)
    return seq[np.argsort(keys, kind="stable")]
