"""`torus-train bench input`: DALI against the torchvision fallback (each of its decoders the device allows) on the
same files and cores, alternating. The measurement is torus_train.bench.input."""

from __future__ import annotations

import os

import click

from torus_train.bench.input import alternate, check_device, format_table, ratio_lines, summarize, variants
from torus_train.commands.optionchecks import input_path
from torus_train.commands.outputs import OutputFile
from torus_train.data.checks import scan
from torus_train.errors import UserError
from torus_train.outfiles import Writer, write_json

WRITER = Writer("bench input")


@click.command("input")
@click.option(
    "--data",
    "root",
    required=True,
    type=click.Path(),
    callback=input_path,
    help="ImageNet-layout folder (train/CLASS/*).",
)
@click.option(
    "--split",
    default="train",
    show_default=True,
    type=click.Choice(["train", "val"]),
    help="train: random-resized crop + flip; val: resize + centre crop.",
)
@click.option("--batch-size", default=64, show_default=True)
@click.option("--image-size", default=224, show_default=True)
@click.option("--threads", default=0, help="DALI threads = torchvision workers (0: all cores).  [default: 0]")
@click.option("--warmup", default=5, show_default=True, help="Batches before timing starts, in every round.")
@click.option("--batches", default=20, show_default=True, help="Timed batches per loader per round.")
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    help="Rounds that alternate the loaders, so both see the same drift in the machine's load.",
)
@click.option("--loaders", default="dali,torchvision", show_default=True, help="Comma-separated loaders to run.")
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="cpu, or cuda / cuda:N (DALI then decodes on the GPU, and torchvision is measured with each decoder).",
)
@click.option("--channels-last/--no-channels-last", default=False, show_default=True)
@click.option("--json", "json_path", type=OutputFile(WRITER), help="Write the results here.")
def bench_input(
    root, split, batch_size, image_size, threads, warmup, batches, rounds, loaders, device, channels_last, json_path
):
    """Images/s of each input pipeline on the same files and cores, and DALI's ratio to torchvision.

    With --device cuda the torchvision loader runs twice, decoding in its workers (cpu) and with nvJPEG on the
    GPU (gpu, data.decoder); on the CPU only the first, said in a line.

    The loaders run one after the other in alternating rounds (each round builds its loader, warms it up,
    times it and closes it, so the other never runs beside it); the table gives each loader's median round.
    """
    kinds = _loader_names(loaders)
    if batches < 1 or warmup < 0 or batch_size < 1 or image_size < 1 or rounds < 1:
        raise UserError("--batches, --rounds, --batch-size and --image-size must be positive, --warmup >= 0")
    if threads < 0:
        raise UserError(f"--threads: {threads} must be >= 0")
    check_device(device)
    threads = threads or os.cpu_count() or 1
    s = scan(root, split)  # fail early, naming the path, before any pipeline starts
    click.echo(
        f"bench input: {s.root} ({len(s)} images, {len(s.classes)} classes), batch {batch_size}, "
        f"{image_size}x{image_size}, {threads} thread(s) each, device {device}, {rounds} round(s) of "
        f"{warmup} warm-up + {batches} timed batches per loader",
        err=True,
    )
    rows, skipped = variants(kinds, device)
    for line in skipped:
        click.echo(line, err=True)
    args = (root, split, batch_size, image_size, threads, warmup, batches, device, channels_last)
    per_round = alternate(rows, rounds, args, lambda line: click.echo(line, err=True))
    results = [summarize(per_round[v]) for v in rows]
    base_row = next((v for v in rows if v == ("torchvision", "cpu")), None)
    base = summarize(per_round[base_row])["images_per_s"] if base_row else None
    for r in results:
        r["ratio_to_torchvision"] = round(r["images_per_s"] / base, 2) if base else None
    click.echo(format_table(results))
    if base and base_row:
        click.echo("\n".join(ratio_lines(rows, results, per_round, base_row, base)))
    if json_path is not None:
        doc = {
            "data": str(s.root),
            "images_in_split": len(s),
            "split": split,
            "batch_size": batch_size,
            "image_size": image_size,
            "threads": threads,
            "device": device,
            "warmup": warmup,
            "rounds": rounds,
            "cpu_count": os.cpu_count(),
            "not_measured": skipped,
            "results": results,
        }
        write_json(json_path, doc, WRITER)
        click.echo(f"wrote {json_path}", err=True)


def _loader_names(loaders: str) -> list[str]:
    """--loaders as a list of loader names, each dali or torchvision (UserError otherwise)."""
    kinds = [k.strip() for k in loaders.split(",") if k.strip()]
    if not kinds:
        raise UserError(f"--loaders: {loaders!r} names no loader; give dali, torchvision or both, comma-separated")
    for k in kinds:
        if k not in ("dali", "torchvision"):
            raise UserError(f"--loaders: {k!r} is not dali or torchvision")
    return kinds
