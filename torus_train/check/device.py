"""The check's parts that run on the device: NCCL in a world of one, the graphed step (train/graphs.py's own
probe, in the real loop), the decoders (data/decode_probe.py), the deterministic repeat. Imports torch."""

from __future__ import annotations

import torch
import torch.distributed as dist

from torus_train.check.parts import Context
from torus_train.check.smallrun import loop_run, small_spec
from torus_train.data.decode_probe import probe_decoder_repeats, probe_device_decoder
from torus_train.train.build import set_determinism
from torus_train.train.graphs import AGREE_TOLERANCE, WARMUP_STEPS
from torus_train.verdict import Verdict

NO_CUDA = "no CUDA device here (torch.cuda.is_available() is False)"
STEP_MODEL = ("resnet18_w32", 64)
"""The graph and repeat parts' model and image side: a small ResNet with BatchNorm, as the production step."""


def nccl(ctx: Context) -> Verdict:
    """One all-reduce on NCCL over the world of one this process makes (the ranks' bootstrap)."""
    if not torch.cuda.is_available():
        return Verdict.cannot_run(f"{NO_CUDA}: runs use gloo")
    boot = ctx.boot()
    if boot.backend != "nccl":
        return Verdict.failed(f"the world of one came up on {boot.backend}, not NCCL")
    t = torch.arange(1, 5, dtype=torch.float32, device=boot.device)
    dist.all_reduce(t)
    torch.cuda.synchronize(boot.device)
    got = t.tolist()
    detail = {"device": str(boot.device), "nccl": ".".join(map(str, torch.cuda.nccl.version())), "result": got}
    if got != [1.0, 2.0, 3.0, 4.0]:
        return Verdict.failed(f"an all-reduce over one rank returned {got}, not [1, 2, 3, 4]", **detail)
    return Verdict.passed(f"an all-reduce on NCCL {detail['nccl']} over one rank on {boot.device}", **detail)


def graphs(ctx: Context) -> Verdict:
    """The real loop with model.cuda_graphs = auto: its probe captures the step after the warm-up, replays it
    once and compares it with the eager step (max relative difference <= AGREE_TOLERANCE)."""
    if not torch.cuda.is_available():
        return Verdict.cannot_run(f"{NO_CUDA}: the step runs eagerly (model.cuda_graphs = auto needs CUDA and NCCL)")
    boot = ctx.boot()
    arch, size = STEP_MODEL
    steps = WARMUP_STEPS + 3
    out = ctx.scratch / "graphs"
    got = loop_run(small_spec(out, 32, steps, arch=arch, image_size=size), boot, out)
    choice = got.choices.get("cuda_graphs", {})
    detail = {
        "model": f"{arch} at {size} px, batch 32, fp16",
        "choice": choice,
        "max_rel_diff": got.rel_diff,
        "tolerance": AGREE_TOLERANCE,
        "capture_seconds": got.capture_seconds,
    }
    if choice.get("choice") != "graphed":
        return Verdict.failed(f"runs eagerly: {choice.get('why')}", **detail)
    return Verdict.passed(choice["why"], **detail)


def decoder_cpu(ctx: Context) -> Verdict:
    """The CPU decoder (data.decoder = cpu) on every embedded kind against PIL: runs here, GPU or not."""
    return probe_device_decoder(torch.device("cpu"))


def decoder_gpu(ctx: Context) -> Verdict:
    """The device decoder on every embedded kind against PIL, and two decodes of one batch bit for bit."""
    if not torch.cuda.is_available():
        return Verdict.cannot_run(f"{NO_CUDA}: data.decoder = auto decodes on the CPU")
    device = torch.device("cuda", torch.cuda.current_device())
    agree, repeat = probe_device_decoder(device), probe_decoder_repeats(device)
    detail = {"agree": agree.to_json(), "repeats": repeat.to_json()}
    if agree.ok is False:
        return Verdict(False, agree.why, detail)
    if repeat.ok is False:
        return Verdict(
            True, f"{agree.why}; but it does not repeat ({repeat.why}): deterministic runs decode on the CPU", detail
        )
    return Verdict(agree.ok, f"{agree.why}; {repeat.why}", detail)


def deterministic(ctx: Context) -> Verdict:
    """The same short run twice with job.deterministic on (the loop, synthetic data): equal parameters."""
    boot = ctx.boot()
    arch, size = STEP_MODEL if boot.device.type == "cuda" else ("resnet18_w32", 32)
    digests = []
    try:
        for i in (1, 2):
            out = ctx.scratch / f"deterministic{i}"
            digests.append(
                loop_run(small_spec(out, 8, 4, arch=arch, image_size=size, deterministic=True), boot, out).digest
            )
    finally:
        set_determinism(False, boot.device)  # the next parts time the default (autotuned) kernels
    detail = {"model": f"{arch} at {size} px, batch 8, 4 steps", "device": boot.device.type, "digests": digests}
    if digests[0] != digests[1]:
        return Verdict.failed(
            f"two deterministic runs on the {boot.device.type} ended with different parameters", **detail
        )
    return Verdict.passed(
        f"two runs of 4 steps with job.deterministic on the {boot.device.type} ended with equal parameters "
        f"(sha256 {digests[0][:12]})",
        **detail,
    )
