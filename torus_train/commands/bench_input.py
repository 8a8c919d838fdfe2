"""`torus-train bench input`: DALI against the torchvision fallback (each of its decoders the device allows) on the
same files and cores, alternating."""

from __future__ import annotations

import os
import re
import statistics
import time

import click

from torus_train.commands.optionchecks import input_path
from torus_train.commands.outputs import OutputFile
from torus_train.data import make_loader
from torus_train.data.checks import scan
from torus_train.errors import UserError
from torus_train.job.sources import DECODERS
from torus_train.outfiles import Writer, write_json

WRITER = Writer("bench input")


def variants(kinds: list[str], device: str) -> tuple[list[tuple[str, str]], list[str]]:
    """([(loader, data.decoder)] to measure, [why a decoder is not]): torchvision with each decoder of the
    table that the device can take (the GPU decoder needs CUDA), DALI as it decodes on the device."""
    rows, skipped = [], []
    for kind in kinds:
        if kind != "torchvision":
            rows.append((kind, "auto"))
            continue
        for name, entry in DECODERS.items():
            if name == "auto":  # auto is one of the others
                continue
            try:
                entry.place(device.split(":")[0])
                rows.append((kind, name))
            except UserError as e:
                skipped.append(f"torchvision with data.decoder = {name}: not measured ({e})")
    return rows, skipped


def label(kind: str, decoder: str | None) -> str:
    return f"{kind} ({decoder})" if decoder else kind


def _measure(
    kind: str,
    decoder: str,
    root: str,
    split: str,
    batch: int,
    size: int,
    threads: int,
    warmup: int,
    batches: int,
    device: str,
    channels_last: bool,
) -> dict:
    loader = make_loader(
        kind,
        root,
        split,
        rank=0,
        world_size=1,
        batch_size=batch,
        image_size=size,
        num_classes=None,
        seed=0,
        channels_last=channels_last,
        device=device,
        num_threads=threads,
        decoder=decoder,
    )
    decoded_by = loader.decoder
    steps_per_pass = len(loader)
    done, epoch, t0, t_first = 0, 0, None, time.perf_counter()
    try:
        while done < warmup + batches:
            loader.set_epoch(epoch)
            for x, _ in loader:
                if x.is_cuda:
                    import torch

                    torch.cuda.synchronize()
                done += 1
                if done == warmup:
                    t0 = time.perf_counter()
                if done >= warmup + batches:
                    break
            epoch += 1
    finally:
        loader.close()
    seconds = time.perf_counter() - (t0 if t0 is not None else t_first)
    timed = batches if t0 is not None else done
    return {
        "loader": kind,
        "decoder": decoded_by,
        "threads": threads,
        "batches": timed,
        "images": timed * batch,
        "seconds": round(seconds, 3),
        "images_per_s": round(timed * batch / seconds, 1),
        "steps_per_pass": steps_per_pass,
    }


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
    per_round = _rounds(
        rows, rounds, (root, split, batch_size, image_size, threads, warmup, batches, device, channels_last)
    )
    results = [summarize(per_round[v]) for v in rows]
    base_row = next((v for v in rows if v == ("torchvision", "cpu")), None)
    base = summarize(per_round[base_row])["images_per_s"] if base_row else None
    for r in results:
        r["ratio_to_torchvision"] = round(r["images_per_s"] / base, 2) if base else None
    click.echo(format_table(results))
    if base and base_row:
        _echo_ratios(rows, results, per_round, base_row, base)
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


def _rounds(rows: list[tuple[str, str]], rounds: int, args: tuple) -> dict[tuple[str, str], list[dict]]:
    """Each variant's measurement per round (``_measure(*variant, *args)``), the variants in alternating order
    round by round, so that every one sees the same drift in the machine's load; a line per measurement."""
    per_round: dict[tuple[str, str], list[dict]] = {v: [] for v in rows}
    for r in range(rounds):
        for v in rows if r % 2 == 0 else rows[::-1]:
            m = _measure(*v, *args)
            per_round[v].append(m)
            click.echo(
                f"  round {r + 1}/{rounds}: {label(m['loader'], m['decoder']):<19} {m['images_per_s']:8.1f} img/s",
                err=True,
            )
    return per_round


def _loader_names(loaders: str) -> list[str]:
    """--loaders as a list of loader names, each dali or torchvision (UserError otherwise)."""
    kinds = [k.strip() for k in loaders.split(",") if k.strip()]
    if not kinds:
        raise UserError(f"--loaders: {loaders!r} names no loader; give dali, torchvision or both, comma-separated")
    for k in kinds:
        if k not in ("dali", "torchvision"):
            raise UserError(f"--loaders: {k!r} is not dali or torchvision")
    return kinds


def _echo_ratios(rows: list, results: list[dict], per_round: dict, base_row: tuple, base: float) -> None:
    """Each variant's median img/s over torchvision's (cpu decoder), and the ratio of every round."""
    for v, r in zip(rows, results, strict=True):
        if v != base_row:
            pairs = [
                d["images_per_s"] / t["images_per_s"] for d, t in zip(per_round[v], per_round[base_row], strict=True)
            ]
            click.echo(
                f"{'DALI' if v[0] == 'dali' else label(*v)} / torchvision: {r['images_per_s'] / base:.2f}x "
                f"(median rounds; per round: {', '.join(f'{x:.2f}' for x in pairs)})"
            )


def check_device(device: str) -> None:
    """--device names a device this machine has: cpu, or cuda[:N] with that GPU present (before the scan)."""
    m = re.fullmatch(r"cpu|cuda(?::([0-9]{1,4}))?", device)
    if not m:
        raise UserError(f"--device: {device[:40]!r} must be cpu, cuda or cuda:N")
    if device != "cpu":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(m.group(1) or 0) >= count:
            raise UserError(
                f"--device {device}: this machine has {count} CUDA device(s); use --device cpu"
                + (f" or cuda:0 to cuda:{count - 1}" if count else "")
            )


def summarize(rounds: list[dict]) -> dict:
    """One loader's row (with its decoder): totals over its rounds, and the median round's images/s."""
    rates = sorted(m["images_per_s"] for m in rounds)
    return {
        "loader": rounds[0]["loader"],
        "decoder": rounds[0]["decoder"],
        "threads": rounds[0]["threads"],
        "rounds": len(rounds),
        "batches": sum(m["batches"] for m in rounds),
        "images": sum(m["images"] for m in rounds),
        "seconds": round(sum(m["seconds"] for m in rounds), 3),
        "images_per_s": statistics.median(rates),
        "min_images_per_s": rates[0],
        "max_images_per_s": rates[-1],
        "round_images_per_s": [m["images_per_s"] for m in rounds],
        "steps_per_pass": rounds[0]["steps_per_pass"],
    }


def format_table(results: list[dict]) -> str:
    head = (
        f"{'loader':<19} {'threads':>7} {'rounds':>6} {'images':>7} {'seconds':>8} {'images/s':>9} "
        f"{'min':>7} {'max':>7} {'ratio':>6}"
    )
    lines = [head]
    for r in results:
        ratio = f"{r['ratio_to_torchvision']:.2f}" if r["ratio_to_torchvision"] else "-"
        lines.append(
            f"{label(r['loader'], r['decoder']):<19} {r['threads']:>7} {r['rounds']:>6} {r['images']:>7} "
            f"{r['seconds']:>8.2f} "
            f"{r['images_per_s']:>9.1f} {r['min_images_per_s']:>7.1f} {r['max_images_per_s']:>7.1f} "
            f"{ratio:>6}"
        )
    return "\n".join(lines)
