"""The folder data source: an ImageNet-layout folder (train/CLASS/*.JPEG, val/CLASS/*.JPEG) read through its
file index (data/index.py) by DALI or torchvision. Its entry is ``folder`` in job/sources.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torus_train.data.base import LoaderRequest
from torus_train.data.checks import verify_files
from torus_train.data.index import (
    SPLITS,
    DataError,
    compare_with_folder,
    default_location,
    ensure_index,
    list_classes,
    list_split,
    load_index,
    same_classes,
)
from torus_train.data.layouts import LAYOUTS
from torus_train.data.pipelines import check_class_count, file_loader
from torus_train.data.sweep import SweepReport, folder_chunks, sweep
from torus_train.errors import UserError
from torus_train.job.sources import CheckRequest


def open_loader(request: LoaderRequest):
    """The loader of ``request.root``'s split: its index opened (the launcher built and checked it; tools
    build it here when ``request.build_index``), every JPEG checked first when ``request.verify``."""
    root = request.root
    assert root is not None  # a path source's request names its folder (data.make_loader refuses one without)
    index: str | Path | None = request.index
    if not index and request.build_index:
        index = ensure_index(root, log=lambda m: print(m, file=sys.stderr))
    files = load_index(index or default_location(root), root).split(request.cfg.split)
    if request.verify:
        verify_files(files)
    check_class_count(files, request.num_classes, "class folders")
    return file_loader(files, request)


def layout_problem(root: Path, need_both: bool) -> str | None:
    """Why ``root`` is not an ImageNet-layout folder (train/ and val/; ``need_both``: both, else either)."""
    found = [(root / s).is_dir() for s in SPLITS]
    if all(found) if need_both else any(found):
        return None
    other = next((lay for lay in LAYOUTS if lay.name != "folder" and root.is_dir() and lay.claims(root)), None)
    if other is not None:  # image-net.org's archives or Kaggle's layout: packed first, then trained on
        return (
            f"data.source: {root}: holds {other.help}, which a run does not read; pack it once with: "
            f"torus-train data pack --data {root} --out SHARDS, then run with --data SHARDS"
        )
    return (
        f"data.source: {root}: neither an ImageNet-layout folder (train/CLASS/*, val/CLASS/*) nor a packed "
        f"set (packed.json; torus-train data pack)"
    )


def classes(spec) -> tuple[str, dict]:
    """The preflight's view (no per-file work): each split's classes from the index's meta.json when one
    exists, else one directory read per split."""
    root = Path(spec.data.source)
    problem = layout_problem(root, need_both=False)
    if problem:
        raise UserError(problem)
    index = Path(spec.data.index) if spec.data.index else default_location(root)
    try:
        return str(root), indexed_classes(index) or {s: list_classes(root, s) for s in SPLITS}
    except DataError:
        raise
    except OSError as e:
        raise UserError(f"data.source: {root}: {e.strerror or e}") from None


def indexed_classes(index: Path) -> dict | None:
    """{split: classes} from an index's meta.json, checked as a rank reads it (None when there is none; the
    launcher checks the arrays' checksum and freshness)."""
    if not (index / "meta.json").exists():
        return None
    meta = load_index(index).meta
    return {s: tuple(meta["splits"][s]["classes"]) for s in SPLITS}


def prepare(spec, log=None) -> None:
    """Before any rank starts: the folder's index built (when missing) and checked; the ranks are handed its
    place in spec.data.index."""
    problem = layout_problem(Path(spec.data.source), need_both=True)
    if problem:
        raise UserError(problem)
    spec.data.index = str(ensure_index(spec.data.source, spec.data.index or None, log=log))


def check_files(request: CheckRequest) -> SweepReport:
    """`torus-train data check`: the layout first (class folders, val/'s classes against train/'s, file names,
    and the index against the folder where it has one: a DataError at once), then every file of each split
    on the sweep's process pool; the report counts every unusable file by kind."""
    root, echo = request.root, request.echo
    if all((Path(root) / s).is_dir() for s in SPLITS):
        same_classes(Path(root))
    # each split listed by directory reads only (no stat per file: the sweep names a file it cannot read)
    splits = {split: list_split(root, split) for split in request.splits}
    dest = Path(request.index) if request.index else default_location(root)
    if not (dest / "meta.json").exists():
        echo(f"no index at {dest} (a run builds one; or: torus-train data index --data {root})")
    else:
        idx = load_index(dest, root)
        idx.verify_checksum()
        problems = compare_with_folder(idx)
        if problems:
            raise DataError(
                f"{dest}: index does not match the folder ({'; '.join(problems)}); rebuild it with: "
                f"torus-train data index --data {root}"
            )
        echo(f"{dest}: index matches the folder")
    total = SweepReport(request.decode, request.workers)
    for split, (classes, names, _) in splits.items():
        folder = str(Path(root) / split)
        progress = request.progress(folder) if request.progress else None
        r = sweep(folder_chunks(folder, names), len(names), request.decode, request.workers, progress)
        bad = f"{r.bad:,} will not train" if r.bad else "all train"
        echo(f"{folder}: {len(classes)} classes, {len(names):,} files, {bad} ({r.seconds:.1f} s, {r.rate()})")
        total.add(r)
    return total
