"""Packed data sets: the train and val splits as tar shards in WebDataset's layout, with an index (numpy; no torch).

`torus-train data pack` writes one (data/packer.py); this module is the format and its readers. A packed set is
a folder:

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
classes; see ``epoch_order`` for how an epoch reads it. Validation keeps the folder's order. A shard is opened
through the door (userfiles.py): a FIFO or a device put in a packed set's place is refused, never read.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from torus_train.data.index import (
    SPLITS,
    DataError,
    Split,
    arrays_checksum,
    check_class_names,
    load_arrays,
)
from torus_train.errors import UserError
from torus_train.job.sources import PACKED_FORMAT as FORMAT
from torus_train.job.sources import PACKED_KIND
from torus_train.userfiles import Field, check, open_fd, open_regular, read_json

VERSION = 1
MARKER = PACKED_KIND.marker
ARRAYS = {"starts": np.int64, "offsets": np.int64, "sizes": np.int64, "labels": np.int32, "crc32": np.uint32}
"""Each split's index arrays and their dtypes (all one-dimensional)."""
SHARD_MB_RANGE = (0.01, 65536.0)  # 10 KB (tests) to 64 GiB; 256 MB is WebDataset's and DALI's usual size
SEED_MAX = 2**63 - 1
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
        with open_regular(packed.path / name, "a shard of the packed set") as f:
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
                fd = open_fd(self.split.shard_paths[k], "a shard of the packed set")
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
        except UserError as e:  # the door's one line: missing, not a regular file, unreadable
            return None, f"cannot read shard: {e}"
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
