"""`torus-train data ...`: make the demo data set, check a data folder. No torch import."""
from __future__ import annotations

import sys
import time

import click

from torus_train.errors import UserError


@click.group()
def data() -> None:
    """Data sets: generate the demo set, check an ImageNet-layout folder."""


@data.command("demo")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Folder to create (ImageNet layout: train/CLASS/*.JPEG, val/CLASS/*.JPEG).")
@click.option("--seed", default=0, show_default=True, help="Every image is a function of the seed and its index.")
@click.option("--train-per-class", default=1000, show_default=True, help="Training images per class (10 classes).")
@click.option("--val-per-class", default=100, show_default=True, help="Validation images per class.")
@click.option("--size", default=64, show_default=True, help="Image side in pixels.")
@click.option("--workers", default=2, show_default=True, help="Processes drawing images.")
def demo(out: str, seed: int, train_per_class: int, val_per_class: int, size: int, workers: int) -> None:
    """Generate the demo set: ten shape classes on cluttered, noisy backgrounds, as real JPEG files."""
    from pathlib import Path

    from torus_train.data.demo import generate, read_manifest

    path = Path(out)
    if read_manifest(path) is not None:
        raise UserError(f"--out: {path} already holds a demo data set (demo.json); choose another folder")
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"--out: {path} exists and is not an empty folder")
    last = [0.0]
    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        now = time.time()
        if done == total or now - last[0] > (0.2 if tty else 2.0):
            last[0] = now
            end = "\n" if done == total or not tty else "\r"
            click.echo(f"  {done:>6}/{total} images ({100 * done / total:5.1f}%)", err=True, nl=False)
            click.echo(end, err=True, nl=False)

    click.echo(f"generating the demo data set in {path} (seed {seed}, {size}x{size} px)", err=True)
    m = generate(path, seed=seed, train_per_class=train_per_class, val_per_class=val_per_class, size=size,
                 workers=workers, progress=progress)
    rate = (m["train"] + m["val"]) / max(m["seconds"], 1e-6)
    click.echo(f"demo data set: {path}\n  classes {len(m['classes'])}: {', '.join(m['classes'])}\n"
               f"  train {m['train']} images, val {m['val']} images, {size}x{size} JPEG\n"
               f"  {m['seconds']:.1f} s ({rate:.0f} images/s)")


@data.command("check")
@click.option("--data", "root", required=True, type=click.Path(), help="ImageNet-layout folder.")
@click.option("--split", "splits", multiple=True, default=("train", "val"), show_default=True)
def check(root: str, splits: tuple[str, ...]) -> None:
    """Check a data folder the way a run would: layout, empty classes, non-image files, JPEG markers."""
    from torus_train.data.checks import scan

    for split in splits:
        s = scan(root, split, verify=True)
        click.echo(f"{s.root}: {len(s.classes)} classes, {len(s)} images, ok")
