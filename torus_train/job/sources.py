"""The data sources a job can read: one registry entry each (pure; no torch, and data/ only through the entries'
``"module:attr"`` references, imported when a launcher or a rank uses them).

``data.source`` (``--data``) is either the name of a source that needs no path (``synthetic``, ``demo``) or a
path; a path belongs to the first path source that claims it (a packed set by its packed.json), else it is a
folder. `source_of` answers which entry a value is, and everything that depends on the data asks that entry:

    prepare      the launcher, once before any rank starts: the demo set made, a folder's index built, a
                 packed set's shards checked
    verify       `torus-train data check`: a folder or packed set checked file by file
    classes      the preflight (run and --dry-run): the class names per split, checked against the model
    train_images --dry-run's training work: images per epoch, known without reading the data
    path         the folder the ranks read (container binds, node-local staging)
    open_loader  every rank: the loader, which keeps data/base.py's Loader contract

docs/extending.md ("Adding a data source") walks through adding an entry.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torus_train.errors import UserError
from torus_train.outdir import FolderKind
from torus_train.registry import Registry, load
from torus_train.userfiles import read_json

if TYPE_CHECKING:
    from torus_train.job.sections import JobSpec

SYNTHETIC_SAMPLES = 10_000
"""Images per epoch of synthetic data when data.synthetic_samples is 0 (ImageNet has 1,281,167)."""
DEMO_TRAIN_IMAGES = 10_000
"""The demo set's training images (data/demo.py: 10 classes x 1,000), the default job's data."""

PACKED_FORMAT = "torus-train packed"
PACKED_KIND = FolderKind(
    "packed data set",
    "packed.json",
    lambda m: m.get("format") == PACKED_FORMAT,
    lambda m: load("torus_train.data.packed:own_files")(m),
)
"""How a packed set (data/packed.py) is recognised: its packed.json says our format (the rest is checked when it is
opened, so a damaged one is named, not taken for a folder), and lists its shards."""
MAX_META_BYTES = 64 << 20
"""The largest meta.json or packed.json read (ImageNet's packed.json, listing ~600 shards, is ~150 KB)."""
INDEX_DIR = ".torus-train-index"
"""A data folder's index, at its default place inside the folder (data/index.py)."""


@dataclass(frozen=True)
class CheckRequest:
    """What `torus-train data check` asks of a path source (its ``verify``)."""

    root: str
    """The set: a folder or a packed set."""
    splits: tuple[str, ...] = ("train", "val")
    """The splits to check."""
    index: str | None = None
    """A folder's index, where not at its default place (compared with the folder when it exists)."""
    decode: bool = False
    """Decode every file whole (PIL), not only check its content."""
    workers: int = 1
    """Processes checking files."""
    echo: Callable[[str], None] = print
    """Prints one line of the report."""
    progress: Callable[[str], Callable[[int, int], None]] | None = None
    """progress(what) -> callback(done, total) for the files of ``what`` (a split folder)."""


@dataclass(frozen=True)
class DataSource:
    """One kind of data a job can train on."""

    name: str
    """The registry's name; for a source that takes no path it is also what data.source says."""
    help: str
    """One line for --help, the spec's errors and the docs: how a user names it and what it is."""
    loader: Any
    """``"module:attr"`` of ``open_loader(request: data.base.LoaderRequest) -> data.base.Loader`` (every rank)."""
    train_images: Callable[[Any], tuple[int | None, str]]
    """(training images per epoch or None, where that figure comes from) for a spec, without reading images."""
    takes_path: bool = False
    """data.source is a path (this source's kind of folder), not this entry's name."""
    claims: Callable[[Path], bool] | None = None
    """A path source: whether a path holds this kind of set (one marker file at most); None = every path that
    no other path source claims (the plain folder: one such entry)."""
    classes: Any = None
    """``"module:attr"`` of ``classes(spec) -> (name for messages, {split: class names})`` for the preflight;
    None: the source has no classes to check (labels are drawn in the model's range)."""
    prepare: Any = None
    """``"module:attr"`` of ``prepare(spec, log)``, run once by the launcher before any rank starts; it may set
    spec.data.index (the ranks are handed it). None: nothing to do."""
    verify: Any = None
    """A path source: ``"module:attr"`` of ``verify(request: CheckRequest) -> data.sweep.SweepReport``, the full
    file-by-file check of ``torus-train data check`` (it reads everything; request.echo(line) reports each
    split; the report counts every unusable file by kind)."""
    reads_files: bool = True
    """The ranks read files (data.stage applies to it: refused unless stageable)."""
    stageable: bool = False
    """data.stage = node may copy it to node-local space first (data/stage.py)."""

    @property
    def label(self) -> str:
        """How a user names it: the help before its colon ("demo", "a packed set")."""
        return self.help.split(":")[0]

    def path(self, spec: JobSpec) -> str | None:
        """The folder the ranks read, where data.source names one; None for a named source."""
        return spec.data.source if self.takes_path else None

    def open_loader(self, request: Any) -> Any:
        """This source's loader for ``request`` (data.base.LoaderRequest); imports the loader's module."""
        return load(self.loader)(request)

    def class_names(self, spec: JobSpec) -> tuple[str, dict] | None:
        """(the data's name for messages, {split: class names}), or None where there are none to check."""
        return load(self.classes)(spec) if self.classes else None

    def prepare_data(self, spec: JobSpec, log: Callable[[str], None] | None = None) -> None:
        """The launcher's step before any rank starts (see ``prepare``)."""
        self.check(spec)
        if self.prepare:
            load(self.prepare)(spec, log)

    def check_files(self, request: CheckRequest) -> Any:
        """`torus-train data check --data ROOT`: the set checked file by file (see ``verify``); its report."""
        if not self.verify:
            raise UserError(f"--data: {request.root}: {self.label} has no files to check")
        return load(self.verify)(request)

    def check(self, spec: JobSpec) -> None:
        """What the spec asks of this source that it cannot give, in one line: a missing folder, staging of a
        set that cannot be staged."""
        if self.takes_path and not Path(spec.data.source).is_dir():
            source = spec.data.source
            if os.path.lexists(source) and not Path(source).exists():
                raise UserError(
                    f"data.source: {source}: a symbolic link that leads nowhere (broken, or a loop); "
                    "give the data folder itself"
                )
            raise UserError(
                f"data.source: {source}: no such folder (expected train/ and val/ inside, or a packed set)"
                if not Path(source).exists()
                else f"data.source: {source}: not a folder"
            )
        if spec.data.stage != "none" and self.reads_files and not self.stageable:
            can = " or ".join(s.label for s in SOURCES if s.stageable)
            raise UserError(
                f"data.stage = {spec.data.stage} needs {can} (torus-train data pack --data DIR --out "
                f"SHARDS, then --data SHARDS); data.source is {spec.data.source}"
            )


SOURCES: Registry[DataSource] = Registry("data source")


def source_of(value: str) -> DataSource:
    """The entry data.source = ``value`` names: a source that takes no path by its name, else the path's."""
    if value in SOURCES and not SOURCES.get(value).takes_path:
        return SOURCES.get(value)
    return path_source(value)


def path_source(path: str | Path) -> DataSource:
    """The path source that claims ``path`` (a packed set by its packed.json), else the one that takes any."""
    paths = [s for s in SOURCES if s.takes_path]
    claimed = next((s for s in paths if s.claims is not None and s.claims(Path(path))), None)
    return claimed or next(s for s in paths if s.claims is None)


def choices_text(sep: str = " | ") -> str:
    """The values data.source takes, for --help and errors: 'synthetic | demo | a folder ... | a packed set'."""
    return sep.join(s.label for s in SOURCES)


# ----------------------------------------------------------------------------------------------------------
# the dry run's figures, per source (what is known without reading the data)
# ----------------------------------------------------------------------------------------------------------
def _synthetic_images(spec: JobSpec) -> tuple[int | None, str]:
    n = spec.data.synthetic_samples or SYNTHETIC_SAMPLES
    return n, "data.synthetic_samples" if spec.data.synthetic_samples else "synthetic data's default"


def _demo_images(spec: JobSpec) -> tuple[int | None, str]:
    return DEMO_TRAIN_IMAGES, "the demo set"


def _meta_count(path: Path) -> int | None:
    """splits.train.count of an index's meta.json or a packed set's packed.json; None when it does not read
    (a FIFO or a device is not opened: the launcher's check names it)."""
    try:
        count = read_json(path, "data.source", MAX_META_BYTES)["splits"]["train"]["count"]
    except (UserError, KeyError, TypeError):
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def class_difference(classes: dict) -> str | None:
    """How val/'s classes differ from train/'s, in a few words; None when they are the same list. Labels are
    numbered per split (class i of the sorted list is label i), so any difference would mislabel val/."""
    train, val = list(classes["train"]), list(classes["val"])
    if val == train:
        return None
    names = {split: {str(c) for c in classes[split]} for split in ("train", "val")}
    extra, missing = sorted(names["val"] - names["train"]), sorted(names["train"] - names["val"])
    what = "; ".join(
        x
        for x in (
            f"not in train/: {', '.join(extra[:3])}" if extra else "",
            f"missing in val/: {', '.join(missing[:3])}" if missing else "",
        )
        if x
    )
    return f"val/ has other classes than train/ ({what or 'another order'}); the labels would not match"


def _folder_images(spec: JobSpec) -> tuple[int | None, str]:
    source = spec.data.source
    meta = Path(spec.data.index) if spec.data.index else Path(source) / INDEX_DIR
    count = _meta_count(meta / "meta.json")
    if count is None and not os.path.lexists(source):  # not here: a folder or a packed set, nothing says which
        return None, f"{source} is not on this machine"
    if count is None:
        return None, f"no index of {source} yet (torus-train data index --data {source})"
    return count, f"the index of {source}"


def _packed_images(spec: JobSpec) -> tuple[int | None, str]:
    count = _meta_count(Path(spec.data.source) / PACKED_KIND.marker)
    return (
        count,
        f"the packed set {spec.data.source}"
        if count is not None
        else f"{spec.data.source}: its {PACKED_KIND.marker} does not read",
    )


def register(source: DataSource) -> DataSource:
    """Add ``source`` to the table under its name (SOURCES.remove(name) takes it out again)."""
    return SOURCES.add(source.name, source)


# In the order --help and the docs list them. A path goes to the path source that claims it, else to the
# folder (which claims none: it takes every other path).
register(
    DataSource(
        "synthetic",
        "synthetic: one random batch per rank, made on the device (speed runs; no input pipeline)",
        "torus_train.data.synthetic:open_loader",
        _synthetic_images,
        reads_files=False,
    )
)
register(
    DataSource(
        "demo",
        "demo: ten shape classes as JPEG files, generated on first use into the cache",
        "torus_train.data.demo:open_loader",
        _demo_images,
        classes="torus_train.data.demo:classes",
        prepare="torus_train.data.demo:prepare",
    )
)
register(
    DataSource(
        "folder",
        "an ImageNet-layout folder: train/CLASS/*.JPEG and val/CLASS/*.JPEG, read by DALI or torchvision",
        "torus_train.data.folder:open_loader",
        _folder_images,
        takes_path=True,
        classes="torus_train.data.folder:classes",
        prepare="torus_train.data.folder:prepare",
        verify="torus_train.data.folder:check_files",
    )
)
register(
    DataSource(
        "packed",
        "a packed set: tar shards with an index (torus-train data pack), read by DALI or torchvision",
        "torus_train.data.packed_source:open_loader",
        _packed_images,
        takes_path=True,
        claims=PACKED_KIND.claims,
        classes="torus_train.data.packed_source:classes",
        prepare="torus_train.data.packed_source:prepare",
        verify="torus_train.data.packed_source:check_files",
        stageable=True,
    )
)


# ----------------------------------------------------------------------------------------------------------
# where the torchvision loader decodes (data.decoder)
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decoder:
    """One value of data.decoder: which of the torchvision loader's two decoders a rank on ``device`` uses."""

    name: str
    help: str
    """One line for the docs and errors."""
    place: Callable[[str], str]
    """The rank's device type ("cuda", "cpu") -> "gpu" (nvJPEG, augmentation on the GPU) or "cpu" (PIL in the
    DataLoader workers); a UserError when the device cannot take it."""
    probed: bool = False
    """Where place says "gpu", the run checks the GPU decoder first (train/decoder.py, once before training) and
    decodes on the CPU when it fails; False: place's answer is obeyed as it is."""


def _gpu_only(device_type: str) -> str:
    if device_type != "cuda":
        raise UserError(
            f"data.decoder = gpu needs ranks on CUDA GPUs, not {device_type}; use data.decoder = auto or cpu"
        )
    return "gpu"


DECODERS: Registry[Decoder] = Registry("decoder")
for _d in (
    Decoder(
        "auto",
        "auto: gpu when the ranks are on CUDA and the GPU decoder passes its start-up check, else cpu",
        lambda device_type: "gpu" if device_type == "cuda" else "cpu",
        probed=True,
    ),
    Decoder(
        "cpu",
        "cpu: PIL in the DataLoader's worker processes (crop, flip and normalise there too)",
        lambda device_type: "cpu",
    ),
    Decoder(
        "gpu",
        "gpu: the workers read the files, nvJPEG decodes a batch at once on the rank's GPU, and "
        "the crop, flip and normalise run there",
        _gpu_only,
    ),
):
    DECODERS.add(_d.name, _d)
