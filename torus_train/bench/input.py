"""The input benchmark's measurement (`torus-train bench input`): which loader and decoder pairs a device can
take, one timed pass of a loader over a split, rounds that alternate the loaders so both see the same drift in the
machine's load, and the table and ratios printed from them. The command (commands/bench_input.py) parses and
checks the options and writes the JSON."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable

from torus_train.data import make_loader
from torus_train.errors import UserError
from torus_train.job.sources import DECODERS


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


def measure(
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


def alternate(
    rows: list[tuple[str, str]], rounds: int, args: tuple, echo: Callable[[str], None]
) -> dict[tuple[str, str], list[dict]]:
    """Each variant's measurement per round (``measure(*variant, *args)``), the variants in alternating order
    round by round, so that every one sees the same drift in the machine's load; a line per measurement."""
    per_round: dict[tuple[str, str], list[dict]] = {v: [] for v in rows}
    for r in range(rounds):
        for v in rows if r % 2 == 0 else rows[::-1]:
            m = measure(*v, *args)
            per_round[v].append(m)
            echo(f"  round {r + 1}/{rounds}: {label(m['loader'], m['decoder']):<19} {m['images_per_s']:8.1f} img/s")
    return per_round


def ratio_lines(rows: list, results: list[dict], per_round: dict, base_row: tuple, base: float) -> list[str]:
    """Each variant's median img/s over torchvision's (cpu decoder), and the ratio of every round."""
    lines = []
    for v, r in zip(rows, results, strict=True):
        if v != base_row:
            pairs = [
                d["images_per_s"] / t["images_per_s"] for d, t in zip(per_round[v], per_round[base_row], strict=True)
            ]
            lines.append(
                f"{'DALI' if v[0] == 'dali' else label(*v)} / torchvision: {r['images_per_s'] / base:.2f}x "
                f"(median rounds; per round: {', '.join(f'{x:.2f}' for x in pairs)})"
            )
    return lines


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
