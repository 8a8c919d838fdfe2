"""The file index of an ImageNet-layout folder: scanned once, read by every rank (numpy; no torch import).

A data folder holds ``train/CLASS/*`` and ``val/CLASS/*`` image files. Listing 1.28M files and checking each
one from every rank of a 2,176-rank job would put billions of metadata operations on a parallel file system,
so the folder is scanned once (``os.scandir``: names and entry types come with the directory read, no
per-file ``stat``) and written as an index folder:

    meta.json                       version, data root, classes, counts, the class folders' mtimes, checksum
    train.names.npy, val.names.npy  the paths relative to the split folder, UTF-8, back to back (uint8)
    train.offsets.npy, ...          where each path starts in names (int64, n + 1 entries)
    train.labels.npy, ...           the label of each path (int32; classes sorted, as ImageFolder and DALI)

Ranks open the arrays memory-mapped, so a rank reads only the pages of the entries in its own shard.
A stale index (a class folder changed after it was built), a foreign one (built for another folder), an
unknown version or a damaged one (checksum) is a DataError that says how to rebuild it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torus_train.cache import cache_root
from torus_train.errors import UserError, shown_path
from torus_train.job.sources import INDEX_DIR, class_difference
from torus_train.outdir import FolderKind, check_target, resolve_target, write_folder
from torus_train.userfiles import Field, check, read_json, refuse_special

VERSION = 1
SPLITS = ("train", "val")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
ARRAYS = {"names": np.uint8, "offsets": np.int64, "labels": np.int32}
"""Each split's arrays and their dtypes (all one-dimensional)."""


class DataError(UserError):
    """A data folder, file or index that cannot be read as a data set; the message names the path."""


META_FIELDS = (
    Field("root", "str"),
    Field("checksum", "str"),
    *(
        f
        for s in SPLITS
        for f in (
            Field(f"splits.{s}.classes", "list"),
            Field(f"splits.{s}.count", "int", 0),
            Field(f"splits.{s}.class_mtimes", "list"),
        )
    ),
)
"""What a rank reads from an index's meta.json."""

# An index folder is recognised by its meta.json (version, root, splits): only such a folder, holding nothing
# but the arrays beside it, is replaced.
INDEX_KIND = FolderKind(
    "data index",
    "meta.json",
    lambda m: {"version", "root", "splits"} <= m.keys() and isinstance(m["splits"], dict),
    lambda m: [f"{s}.{k}.npy" for s in SPLITS for k in ARRAYS],
)


class Names(Sequence):
    """Paths of one split decoded on demand from the index arrays: ``names[i]`` is the i-th absolute path."""

    def __init__(self, prefix: str, blob: np.ndarray, offsets: np.ndarray):
        self.prefix, self.blob, self.offsets = prefix, blob, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        return self.prefix + self.blob[self.offsets[i] : self.offsets[i + 1]].tobytes().decode()


@dataclass(frozen=True)
class Split:
    """One split of a data folder: its classes, and its files and labels in (class, name) order."""

    root: Path
    """The split folder, e.g. DATA/train."""
    classes: tuple[str, ...]
    """Class-folder names in sorted order; label i is classes[i]."""
    files: Sequence[str]
    """Absolute image paths."""
    labels: Sequence[int] | np.ndarray
    """Label of each file."""

    def __len__(self) -> int:
        return len(self.files)


# --------------------------------------------------------------------------------------------------------
# scanning a folder
# --------------------------------------------------------------------------------------------------------
def list_split(data_root: str | os.PathLike, split: str) -> tuple[tuple[str, ...], list[str], list[int]]:
    """(classes, paths relative to the split folder, labels) of ``data_root/split``, by directory reads only."""
    data = Path(data_root)
    try:
        return _list_split(data, split)
    except OSError as e:  # a symlink loop, a folder without read permission, a vanished file
        where = e.filename if e.filename is not None else data / split
        raise DataError(f"{os.fsdecode(where)}: {e.strerror or e} (while listing {data / split})") from None


def _list_split(data: Path, split: str) -> tuple[tuple[str, ...], list[str], list[int]]:
    if not data.is_dir():
        raise DataError(f"{data}: data folder not found" if not data.exists() else f"{data}: not a folder")
    root = data / split
    if not root.is_dir():
        raise DataError(f"{root}: missing (expected {split}/CLASS/*.JPEG under {data})")
    with os.scandir(root) as it:
        entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    stray = [e.name for e in entries if not e.is_dir()]
    if stray:
        raise DataError(f"{root / stray[0]}: a file where class folders are expected")
    classes = tuple(_utf8(root, e.name) for e in entries)
    if not classes:
        raise DataError(f"{root}: no class folders (expected {split}/CLASS/*.JPEG)")
    names: list[str] = []
    labels: list[int] = []
    for label, c in enumerate(classes):
        files = _image_files(root / c)
        names += [f"{c}/{n}" for n in files]
        labels += [label] * len(files)
    return classes, names, labels


def _image_files(folder: Path) -> list[str]:
    """The sorted image names of a class folder; anything else in it (a file of another type, a folder even
    when named like an image, a broken link, a FIFO) is refused, naming the first."""
    with os.scandir(folder) as it:
        entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    if not entries:
        raise DataError(f"{folder}: empty class folder")
    for e in entries:
        name = _utf8(folder, e.name)
        if os.path.splitext(name)[1].lower() not in IMAGE_EXTENSIONS:
            raise DataError(f"{folder / name}: not an image file (expected one of {', '.join(IMAGE_EXTENSIONS)})")
        if not e.is_file():  # the entry's type comes with the directory read: no stat unless it is a link
            what = "a folder" if e.is_dir() else "not a regular file (a broken link, a FIFO or a device)"
            raise DataError(f"{folder / name}: {what}, not an image; only image files belong in a class folder")
    return [e.name for e in entries]


def same_classes(data: Path) -> dict[str, tuple[str, ...]]:
    """Each split's class folders (one directory read per split), refused unless val/ holds exactly train/'s:
    labels are numbered per split, so another set would give val/ images another class's label."""
    classes = {split: list_classes(data, split) for split in SPLITS}
    differ = class_difference(classes)
    if differ:
        raise DataError(f"{data}: {differ}; make both hold the same class folders")
    return classes


def _utf8(folder: Path, name: str) -> str:
    """The name, refused when it is not valid UTF-8 (the index stores UTF-8; the path is shown escaped)."""
    try:
        name.encode()
    except UnicodeEncodeError:
        shown = os.fsencode(name).decode("utf-8", "backslashreplace")
        raise DataError(f"{folder}/{shown}: the name is not valid UTF-8; rename it (e.g. with convmv)") from None
    return name


def list_classes(data_root: str | os.PathLike, split: str) -> tuple[str, ...]:
    """The class folders of ``data_root/split`` (one directory read; the preflight's view of a folder)."""
    data = Path(data_root)
    root = data / split
    if not root.is_dir():
        raise DataError(f"{root}: missing (expected {split}/CLASS/*.JPEG under {data})")
    try:
        classes = tuple(_utf8(root, c) for c in _classes(data, split))
    except OSError as e:
        raise DataError(f"{root}: {e.strerror or e}") from None
    if not classes:
        raise DataError(f"{root}: no class folders (expected {split}/CLASS/*.JPEG)")
    return classes


def class_mtimes(data_root: Path, split: str, classes: Sequence[str]) -> list[int]:
    """mtime_ns of each class folder: adding, removing or renaming a file in it changes it."""
    return [os.stat(data_root / split / c).st_mtime_ns for c in classes]


# --------------------------------------------------------------------------------------------------------
# writing and reading the index
# --------------------------------------------------------------------------------------------------------
def default_location(data_root: str | os.PathLike) -> Path:
    """DATA/.torus-train-index where the data folder is writable, else a folder in the cache named after it."""
    data = Path(data_root).resolve()
    if os.access(data, os.W_OK):
        return data / INDEX_DIR
    return cache_root() / "index" / hashlib.sha256(str(data).encode()).hexdigest()[:16]


def _arrays(names: list[str], labels: list[int]) -> dict[str, np.ndarray]:
    encoded = [n.encode() for n in names]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return {
        "names": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        "offsets": offsets,
        "labels": np.asarray(labels, dtype=np.int32),
    }


def arrays_checksum(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over the arrays' names and bytes in name order (an index's and a packed set's checksum)."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).data)
    return h.hexdigest()


def build_index(
    data_root: str | os.PathLike, location: str | os.PathLike | None = None, log=None, flag: str = "--index"
) -> Path:
    """Scan ``data_root`` once and write its index (a finished index or none; see torus_train.outdir); its
    folder. A target that is not an index of this project, or one inside the data's split folders, is refused
    before the scan."""
    t0 = time.time()
    data = resolve_data(data_root)
    dest = check_index_target(data, location, flag)
    if data.is_dir() and all((data / s).is_dir() for s in SPLITS):
        same_classes(data)  # before the scan (one directory read per split); list_split names other faults
    meta: dict = {"version": VERSION, "root": str(data), "splits": {}}
    arrays: dict[str, np.ndarray] = {}
    for split in SPLITS:
        classes, names, labels = list_split(data, split)
        for key, a in _arrays(names, labels).items():
            arrays[f"{split}.{key}"] = a
        meta["splits"][split] = {
            "classes": list(classes),
            "count": len(names),
            "class_mtimes": class_mtimes(data, split, classes),
        }
    meta["checksum"] = arrays_checksum(arrays)
    meta["seconds"] = round(time.time() - t0, 3)
    _write(dest, meta, arrays, flag)
    if log:
        counts = ", ".join(f"{s} {meta['splits'][s]['count']:,}" for s in SPLITS)
        log(f"indexed {data}: {counts} files in {meta['seconds']:.1f} s -> {dest}")
    return dest


def resolve_data(data_root: str | os.PathLike, flag: str = "--data") -> Path:
    """The data folder's absolute path; a symlink loop or an unreadable path is one line naming ``flag`` (a
    missing folder is left to the scan, which says what it expected)."""
    try:
        path = Path(data_root).resolve()
    except RuntimeError:  # how Python before 3.13 reports a symlink loop
        raise DataError(f"{flag} {shown_path(data_root)}: a symlink loop (too many levels of symbolic links)") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{flag} {shown_path(data_root)}: {getattr(e, 'strerror', None) or e}") from None
    try:
        path.stat()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise DataError(f"{flag} {shown_path(data_root)}: {e.strerror or e}") from None
    return path


def check_index_target(data: Path, location: str | os.PathLike | None, flag: str = "--index") -> Path:
    """Where the index of ``data`` goes: refused (UserError naming ``flag``) when something other than an index
    stands there or when it lies inside the data's split folders (it would become a class or be scanned)."""
    dest = resolve_target(location, flag) if location else default_location(data)
    for split in SPLITS:
        inside = data / split
        if dest == inside or inside in dest.parents:
            raise UserError(
                f"{flag} {dest}: inside the data folder's {split}/ (it would be read as a class); "
                f"put the index elsewhere, or leave {flag} out for {data / INDEX_DIR}"
            )
    if dest == data or dest in data.parents:
        raise UserError(f"{flag} {dest}: holds the data folder {data}; the index needs a folder of its own")
    check_target(dest, INDEX_KIND, flag)
    return dest


def _write(dest: Path, meta: dict, arrays: dict[str, np.ndarray], flag: str) -> None:
    def fill(tmp: Path) -> None:
        for key, a in arrays.items():
            np.save(tmp / f"{key}.npy", a)
        (tmp / "meta.json").write_text(json.dumps(meta))

    try:
        write_folder(dest, INDEX_KIND, flag, fill)
    except OSError as e:
        raise DataError(
            f"{dest}: cannot write the index ({e.strerror or e}); pass a writable place with {flag}"
        ) from None


def _rebuild_hint(data: str) -> str:
    return f"rebuild it with: torus-train data index --data {data}"


@dataclass(frozen=True)
class Index:
    """A loaded index: the meta data and, per split, memory-mapped arrays."""

    path: Path
    meta: dict
    arrays: dict[str, np.ndarray]

    @property
    def root(self) -> Path:
        return Path(self.meta["root"])

    def split(self, name: str) -> Split:
        s = self.meta["splits"][name]
        files = Names(str(self.root / name) + os.sep, self.arrays[f"{name}.names"], self.arrays[f"{name}.offsets"])
        return Split(self.root / name, tuple(s["classes"]), files, self.arrays[f"{name}.labels"])

    def verify_checksum(self) -> None:
        if arrays_checksum(self.arrays) != self.meta["checksum"]:
            raise DataError(f"{self.path}: index is damaged (checksum differs); {_rebuild_hint(str(self.root))}")

    def check_fresh(self) -> None:
        """Stale if a class folder was added, removed or changed since the index was built (one stat per
        class folder; the launcher does this once, ranks do not)."""
        for split, s in self.meta["splits"].items():
            try:
                current = _classes(self.root, split)
                same = current == tuple(s["classes"]) and class_mtimes(self.root, split, current) == s["class_mtimes"]
            except OSError:
                same = False
            if not same:
                raise DataError(
                    f"{self.path}: index is stale ({self.root / split} changed after it was built); "
                    f"{_rebuild_hint(str(self.root))}"
                )


def _classes(data: Path, split: str) -> tuple[str, ...]:
    with os.scandir(data / split) as it:
        return tuple(sorted(e.name for e in it if not e.name.startswith(".") and e.is_dir()))


def load_index(path: str | os.PathLike, data_root: str | os.PathLike | None = None) -> Index:
    """Open an index memory-mapped; DataError if missing, of another version, damaged in shape, or built for
    another folder than ``data_root``."""
    p = Path(path)
    hint = _rebuild_hint(str(data_root or "DIR"))
    if not (p / "meta.json").exists():
        raise DataError(f"{p}: no index there; build one with: torus-train data index --data {data_root or 'DIR'}")
    try:
        meta = read_json(p / "meta.json", "index")
        if not isinstance(meta, dict) or meta.get("version") != VERSION:
            raise DataError(
                f"{p}: index version {meta.get('version') if isinstance(meta, dict) else '?'} is not {VERSION}"
            )
        check(meta, META_FIELDS, f"{p / 'meta.json'}")
        for s in SPLITS:
            check_class_names(meta["splits"][s]["classes"], f"{p / 'meta.json'}: splits.{s}.classes")
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in meta["splits"][s]["class_mtimes"]):
                raise DataError(f"{p / 'meta.json'}: splits.{s}.class_mtimes: must be a list of integers")
        counts = {s: meta["splits"][s]["count"] for s in SPLITS}
        arrays = load_arrays(
            p, ARRAYS, {"names": None, "offsets": lambda s: counts[s] + 1, "labels": lambda s: counts[s]}
        )
    except UserError as e:
        raise DataError(f"{e}; {hint}") from None
    if data_root is not None and Path(meta["root"]) != Path(data_root).resolve():
        raise DataError(
            f"{p}: this index was built for {meta['root']}, not {Path(data_root).resolve()}; "
            f"{_rebuild_hint(str(data_root))}"
        )
    return Index(p, meta, arrays)


def check_class_names(classes: list, where: str) -> None:
    """A split's class names as written by this project: unique non-empty strings (label i is classes[i])."""
    for i, c in enumerate(classes):
        if not isinstance(c, str) or not c:
            raise DataError(f"{where}[{i}]: {c!r} must be a class name (a non-empty string)"[:300])
    if len(set(classes)) != len(classes):
        raise DataError(f"{where}: a class name appears twice")


def load_arrays(folder: Path, dtypes: dict, lengths: dict) -> dict[str, np.ndarray]:
    """Each split's arrays ``SPLIT.KEY.npy`` memory-mapped, checked for dtype, one dimension and length
    (``lengths[key](split)``; None: any); each file must be a regular file (a FIFO is refused unopened)."""
    arrays = {}
    for s in SPLITS:
        for key, dtype in dtypes.items():
            f = folder / f"{s}.{key}.npy"
            refuse_special(f, "index array")
            try:
                a = np.load(f, mmap_mode="r", allow_pickle=False)
            except FileNotFoundError:
                raise DataError(f"{f}: missing") from None
            except (OSError, ValueError, EOFError) as e:
                raise DataError(f"{f}: not a readable array ({getattr(e, 'strerror', None) or e})") from None
            want = lengths[key](s) if lengths.get(key) else None
            if (
                not isinstance(a, np.ndarray)
                or a.ndim != 1
                or a.dtype != dtype
                or (want is not None and len(a) != want)
            ):
                shape = getattr(a, "shape", "?")
                raise DataError(
                    f"{f}: {getattr(a, 'dtype', type(a).__name__)} {shape}, expected "
                    f"{np.dtype(dtype).name} of {want if want is not None else 'any'} entries (damaged)"
                )
            arrays[f"{s}.{key}"] = a
    return arrays


def ensure_index(data_root: str | os.PathLike, location: str | os.PathLike | None = None, log=None) -> Path:
    """The launcher's step before any rank starts: the index of ``data_root`` (built when missing), checked
    whole (checksum) and fresh; its folder, which the ranks are given."""
    dest = Path(location) if location else default_location(data_root)
    if not (dest / "meta.json").is_file():
        return build_index(data_root, dest, log)
    index = load_index(dest, data_root)
    index.verify_checksum()
    index.check_fresh()
    return dest


def compare_with_folder(index: Index) -> list[str]:
    """A full rescan against the index (``data check``): the differences, at most a few named."""
    problems = []
    for split in SPLITS:
        classes, names, labels = list_split(index.root, split)
        s = index.split(split)
        if classes != s.classes:
            problems.append(f"{split}: classes differ ({len(classes)} in the folder, {len(s.classes)} indexed)")
            continue
        indexed = [s.files[i][len(str(s.root)) + 1 :] for i in range(len(s))]
        if indexed != names:
            extra = sorted(set(names) - set(indexed))[:3]
            gone = sorted(set(indexed) - set(names))[:3]
            problems.append(
                f"{split}: {len(names)} files in the folder, {len(indexed)} indexed"
                + (f"; not indexed: {', '.join(extra)}" if extra else "")
                + (f"; gone: {', '.join(gone)}" if gone else "")
            )
        elif list(s.labels) != labels:
            problems.append(f"{split}: labels differ")
    return problems
