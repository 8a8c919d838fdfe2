"""`torus-train data ...`: make the demo data set, index a data folder, check it. No torch import."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from torus_train.commands.optionchecks import input_path
from torus_train.commands.outputs import OutputFolder
from torus_train.data.demo import generate, read_manifest
from torus_train.data.index import INDEX_KIND, build_index, load_index, resolve_data
from torus_train.data.layouts import LAYOUTS
from torus_train.data.packed import load_packed
from torus_train.data.packer import pack as pack_set
from torus_train.errors import UserError, check_output_folder
from torus_train.job.launch import usable_cpus
from torus_train.job.sources import PACKED_KIND, CheckRequest, path_source


@click.group()
def data() -> None:
    """Data sets: generate the demo set, index and check an ImageNet-layout folder."""


@data.command()
@click.option(
    "--out",
    "out",
    required=True,
    type=OutputFolder(),
    help="Folder to create (ImageNet layout: train/CLASS/*.JPEG, val/CLASS/*.JPEG).",
)
@click.option("--seed", default=0, show_default=True, help="Every image is a function of the seed and its index.")
@click.option("--train-per-class", default=1000, show_default=True, help="Training images per class (10 classes).")
@click.option("--val-per-class", default=100, show_default=True, help="Validation images per class.")
@click.option("--size", default=64, show_default=True, help="Image side in pixels.")
@click.option("--workers", default=2, show_default=True, help="Processes drawing images.")
def demo(out: str, seed: int, train_per_class: int, val_per_class: int, size: int, workers: int) -> None:
    """Generate the demo set: ten shape classes on cluttered, noisy backgrounds, as real JPEG files."""
    check_output_folder(out, "--out")
    for flag, value, low, high in (
        ("--train-per-class", train_per_class, 1, 1_000_000),
        ("--val-per-class", val_per_class, 0, 1_000_000),
        ("--size", size, 8, 4096),
        ("--workers", workers, 1, 1024),
        ("--seed", seed, 0, 2**63 - 1),
    ):
        if not low <= value <= high:
            raise UserError(f"{flag}: {value} must be between {low} and {high:,}")
    path = Path(out)
    if read_manifest(path) is not None:
        raise UserError(f"--out: {path} already holds a demo data set (demo.json); choose another folder")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"--out: {path} exists and is not an empty folder")
    click.echo(f"generating the demo data set in {path} (seed {seed}, {size}x{size} px)", err=True)
    m = generate(
        path,
        seed=seed,
        train_per_class=train_per_class,
        val_per_class=val_per_class,
        size=size,
        workers=workers,
        progress=progress_bar("images"),
    )
    rate = (m["train"] + m["val"]) / max(m["seconds"], 1e-6)
    click.echo(
        f"demo data set: {path}\n  classes {len(m['classes'])}: {', '.join(m['classes'])}\n"
        f"  train {m['train']} images, val {m['val']} images, {size}x{size} JPEG\n"
        f"  {m['seconds']:.1f} s ({rate:.0f} images/s)"
    )


def progress_bar(what: str, after: float = 0.0) -> Callable[[int, int], None]:
    """progress(done, total) that draws "done/total WHAT (percent)" on stderr: redrawn in place on a terminal
    (5 times a second), a line every 2 s otherwise; silent until ``after`` seconds have passed (a small job
    prints nothing), and a last line at the end when it drew any."""
    tty = sys.stderr.isatty()
    start, last = time.time(), [0.0]

    def progress(done: int, total: int) -> None:
        now = time.time()
        if now - start < after or (done < total and now - last[0] <= (0.2 if tty else 2.0)):
            return
        last[0] = now
        rate = done / max(now - start, 1e-9)
        end = "\n" if done == total or not tty else "\r"
        line = f"  {done:>9,}/{total:,} {what} ({100 * done / max(total, 1):5.1f}%, {rate:,.0f}/s)"
        click.echo(line + end, err=True, nl=False)

    return progress


INDEX_HELP = "Index folder (default: DATA/.torus-train-index, or the cache where DATA is read-only)."


@data.command("index")
@click.option("--data", "root", required=True, type=click.Path(), callback=input_path, help="ImageNet-layout folder.")
@click.option("--index", "location", default=None, type=OutputFolder(INDEX_KIND), help=INDEX_HELP)
def index(root: str, location: str | None) -> None:
    """Scan a data folder once and write its file index, which every rank of a run reads instead of the folder."""
    dest = build_index(root, location, log=lambda m: click.echo(m, err=True))
    meta = load_index(dest, root).meta
    for split, s in meta["splits"].items():
        click.echo(f"{split}: {len(s['classes'])} classes, {s['count']:,} files")
    click.echo(f"index: {dest} (checksum {meta['checksum'][:12]}, scanned in {meta['seconds']:.1f} s)")


@data.command("check")
@click.option(
    "--data",
    "root",
    required=True,
    type=click.Path(),
    callback=input_path,
    help="ImageNet-layout folder or packed set.",
)
@click.option(
    "--split", "splits", multiple=True, default=("train", "val"), show_default=True, help="A split to check (repeat)."
)
@click.option("--index", "location", default=None, type=click.Path(), help=INDEX_HELP)
@click.option("--decode", is_flag=True, help="Decode every file whole (PIL): the check to run once before a long job.")
@click.option("--workers", default=None, type=int, help="Processes checking files [default: every usable core].")
def check(root: str, splits: tuple[str, ...], location: str | None, decode: bool, workers: int | None) -> None:
    """Check every file of a data folder or packed set: its layout, its index, and each file's content (empty,
    truncated, not an image; with --decode, decoded whole). Every problem is counted by kind and the first
    files of each are named; exit 0 when every file trains, 2 otherwise."""
    if workers is not None and not 1 <= workers <= 1024:
        raise UserError(f"--workers: {workers} must be between 1 and 1,024")
    for split in splits:  # a split is one folder name of DATA: '' or '..' would check the wrong folder
        if not split.strip() or split in (".", "..") or "/" in split or "\\" in split:
            raise UserError(f"--split {split!r}: give a split's folder name, e.g. train or val")
    resolve_data(root)  # a symlink loop is named, not taken for a missing folder
    request = CheckRequest(
        root,
        splits,
        location,
        decode,
        workers or usable_cpus(),
        click.echo,
        lambda what: progress_bar(f"files of {Path(what).name}", 1.0),
    )
    report = path_source(root).check_files(request)
    for line in report.summary():
        click.echo(line)
    if report.bad:
        raise UserError(f"{report.verdict()}; fix or remove them, or train with data.on_corrupt = skip")


PACK_DATA_HELP = (
    "The data set: an ImageNet-layout folder (train/WNID/*, val/WNID/*), a folder holding image-net.org's "
    "ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and ILSVRC2012_devkit_t12.tar.gz, or Kaggle's download "
    "(ILSVRC/Data/CLS-LOC/, LOC_val_solution.csv, LOC_synset_mapping.txt)."
)


@data.command("pack")
@click.option("--data", "root", required=True, type=click.Path(), callback=input_path, help=PACK_DATA_HELP)
@click.option(
    "--out",
    "out",
    required=True,
    type=OutputFolder(PACKED_KIND),
    help="New folder for the packed set (or an older packed set to replace).",
)
@click.option("--shard-mb", default=256.0, show_default=True, type=float, help="Target size of a tar shard in MB.")
@click.option(
    "--seed", default=0, show_default=True, help="Seeds the order of the training samples in the shards (0 to 2**63-1)."
)
def pack(root: str, out: str, shard_mb: float, seed: int) -> None:
    """Pack a data set into tar shards in WebDataset's layout (KEY.jpg + KEY.cls) with an index that ranks
    open instead of listing files; `run --data SHARDS` reads it. image-net.org's archives are read in place
    (nothing is extracted) and labelled from the devkit; Kaggle's layout from LOC_val_solution.csv."""
    dest = pack_set(root, out, shard_mb, seed, log=lambda m: click.echo(m, err=True))
    meta = load_packed(dest).meta
    click.echo(f"layout: {LAYOUTS.get(meta.get('layout', 'folder')).help}")
    for split, s in meta["splits"].items():
        click.echo(f"{split}: {len(s['classes'])} classes, {s['count']:,} samples, {len(s['shards'])} shards")
    names = meta.get("class_names")
    if names:
        shown = "; ".join(f"{c} {n}" for c, n in zip(meta["splits"]["train"]["classes"][:3], names, strict=False))
        click.echo(f"class names: {len(names):,} ({shown}{'; ...' if len(names) > 3 else ''})")
    click.echo(f"packed set: {dest} ({meta['bytes'] / 1e6:,.1f} MB, checksum {meta['checksum'][:12]})")
