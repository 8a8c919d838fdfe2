"""The loop's img/s against the bare step's at per-GPU batch 16, 32 and 256, rounds alternating: the check's
throughput part and the acceptance test's graphs part (accept_graphs.py) measure with these functions.

The bare step: the same model, fp16 autocast on a GPU with a fixed loss scale, fused SGD, gradients exchanged in
25 MiB buckets with the torus's three phases (reduce-scatter, all-reduce, all-gather) over the world of one, no
loader, no owned buckets, no skip logic; captured whole as one CUDA graph where CUDA is (the ceiling a graphed
loop can reach). On a CPU both run eagerly at a small model and image size, so that the part ends in seconds:
CPU figures, which say nothing of a GPU. Imports torch."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from torus_train.check.parts import Context
from torus_train.check.smallrun import loop_run, small_spec
from torus_train.comm import collectives
from torus_train.train.build import build_model
from torus_train.verdict import Verdict

BATCHES = (16, 32, 256)
PASS = {16: 0.85, 32: 0.85, 256: 0.95}
"""GPU pass lines: the graphed loop's img/s over the graphed bare step's, per per-GPU batch."""
BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Setting:
    """What is timed: the model, its image side and classes, steps before and in the timing, rounds."""

    arch: str
    size: int
    classes: int
    warm: int
    steps: int
    rounds: int


CPU = Setting("resnet18_w32", 32, 10, warm=1, steps=4, rounds=1)
GPU = Setting("resnet50", 224, 1000, warm=8, steps=20, rounds=1)


def setting_for(device: torch.device, quick: bool = False) -> Setting:
    if device.type == "cuda":
        return Setting(GPU.arch, GPU.size, GPU.classes, GPU.warm, 10 if quick else GPU.steps, GPU.rounds)
    return CPU


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fresh_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def ours_img_s(boot, out: Path, batch: int, s: Setting, graphs: bool = True) -> tuple[float, list]:
    """(img/s of the loop after its warm-up, its capture seconds): train/loop.py in this process on synthetic
    data (model.cuda_graphs = auto where ``graphs``, else off)."""
    fresh_memory(boot.device)
    spec = small_spec(
        out,
        batch,
        s.warm + s.steps,
        arch=s.arch,
        image_size=s.size,
        num_classes=s.classes,
        cuda_graphs="auto" if graphs else "off",
    )
    got = loop_run(spec, boot, out, warm=s.warm)
    return float(got.img_s or 0.0), got.capture_seconds


def bare_img_s(boot, batch: int, s: Setting, graphed: bool) -> float:
    """img/s of the bare step (module docstring); ``graphed`` captures it (CUDA only)."""
    dev = boot.device
    fresh_memory(dev)
    torch.manual_seed(0)
    model = build_model_plain(s, dev)
    params = list(model.parameters())
    buckets = bucket_params(params)
    amp = torch.float16 if dev.type == "cuda" else None
    flats = [torch.empty(sum(p.numel() for p in b), device=dev, dtype=amp or torch.float32) for b in buckets]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    x = torch.randn(batch, 3, s.size, s.size, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, s.classes, (batch,), device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None, cache_enabled=False):
            loss = loss_fn(model(x), y)
        (loss * 1024.0).backward()
        for b, flat in zip(buckets, flats, strict=True):
            torch.cat([p.grad.reshape(-1) for p in b], out=flat)
            piece = torch.empty_like(flat)  # a world of one: the row's piece is the whole bucket
            collectives.reduce_scatter(piece, flat)
            dist.all_reduce(piece)
            collectives.all_gather(flat, piece)
            pieces = torch.split(flat, [p.numel() for p in b])
            torch._foreach_copy_([p.grad for p in b], [t.view(p.shape) for t, p in zip(pieces, b, strict=True)])
        opt.step()

    t = 0.0
    run = graph_of(step, dev) if graphed and dev.type == "cuda" else step
    for i in range(s.warm + s.steps):
        if i == s.warm:
            sync(dev)
            t = time.perf_counter()
        run()
    sync(dev)
    return s.steps * batch / (time.perf_counter() - t)


def build_model_plain(s: Setting, dev: torch.device) -> torch.nn.Module:
    """The loop's model (train/build.py: channels_last), built from the same spec fields."""
    spec = small_spec("bare", 1, 1, arch=s.arch, image_size=s.size, num_classes=s.classes)
    return build_model(spec, dev).to(memory_format=torch.channels_last)


def bucket_params(params: list) -> list[list]:
    """The parameters in reverse order, cut after BUCKET_BYTES of fp16 gradients (the bare step's buckets)."""
    buckets, cur, n = [], [], 0
    for p in reversed(params):
        cur.append(p)
        n += p.numel() * 2
        if n >= BUCKET_BYTES:
            buckets.append(cur)
            cur, n = [], 0
    return buckets + ([cur] if cur else [])


def graph_of(step: Callable[[], None], dev: torch.device) -> Callable[[], None]:
    """Three eager warm-up steps on a side stream, then ``step`` captured; returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g.replay


def alternating(columns: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """{column: median img/s} over ``rounds``, the order reversed every other round (drift and clocks hurt every
    column alike)."""
    runs: dict[str, list[float]] = {k: [] for k in columns}
    for r in range(rounds):
        for name in list(columns) if r % 2 == 0 else list(reversed(columns)):
            runs[name].append(columns[name]())
    return {k: round(statistics.median(v), 1) for k, v in runs.items()}


def row_at(boot, out: Path, batch: int, s: Setting, graphed: bool) -> dict:
    """{ours_img_s, bare_img_s, ratio} at one per-GPU batch (both graphed where ``graphed``)."""
    row: dict = alternating(
        {
            "ours_img_s": lambda: ours_img_s(boot, out, batch, s, graphs=graphed)[0],
            "bare_img_s": lambda: bare_img_s(boot, batch, s, graphed),
        },
        s.rounds,
    )
    row["ratio"] = round(row["ours_img_s"] / row["bare_img_s"], 3)
    return row


def throughput(ctx: Context) -> Verdict:
    """The loop (graphed where CUDA is) against the bare step (graphed where CUDA is) at each batch of BATCHES."""
    boot = ctx.boot()
    cuda = boot.device.type == "cuda"
    s = setting_for(boot.device, ctx.quick)
    rows = {}
    for batch in BATCHES:
        ctx.say(f"check: throughput at per-GPU batch {batch} ({s.arch}, {s.size} px)")
        rows[str(batch)] = row_at(boot, ctx.scratch / f"throughput{batch}", batch, s, graphed=cuda)
    text = ", ".join(
        f"{b}: {r['ours_img_s']:,.0f} vs {r['bare_img_s']:,.0f} img/s ({r['ratio']:.2f})" for b, r in rows.items()
    )
    detail = {
        "device": boot.device.type,
        "model": f"{s.arch} at {s.size} px",
        "steps": s.steps,
        "batches": rows,
        "bare": "graphed" if cuda else "eager",
    }
    if not cuda:
        return Verdict.cannot_run(f"CPU figures ({s.arch}, {s.size} px; no pass line off a GPU): {text}", **detail)
    detail["pass_if"] = {str(b): v for b, v in PASS.items()}
    low = [b for b in BATCHES if rows[str(b)]["ratio"] < PASS[b]]
    if low:
        return Verdict.failed(f"below the pass line at batch {', '.join(map(str, low))}: {text}", **detail)
    return Verdict.passed(f"graphed loop against graphed bare step: {text}", **detail)
