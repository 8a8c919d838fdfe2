"""The acceptance parts that run the real loop in this process on the shrunk production spec (shrunk.py):
host reads per step (syncs), the loop against a bare PyTorch loop and its peak memory (speed), and two
deterministic runs with the mode's cost (digest). A rehearsal runs them on the CPU at toy size. Imports torch."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torchvision

from torus_train.check.shrunk import SPEC, Shrunk, stages
from torus_train.check.smallrun import loop_run, world_of_one
from torus_train.check.syncs import count_loop_syncs, counter_for
from torus_train.check.throughput import fresh_memory, sync
from torus_train.job.rank import Bootstrap

SYNC_STEPS = 12
"""The syncs part's steps: 7 counted (not the first, not a logging interval's, not the CUDA graph probe's at
step 4: steps 2 and 3 eager, the rest replays). A rehearsal runs 7 (4 counted, all eager)
at 32 px: on the CPU, fp16 autocast (forced, for the GradScaler's path) has no fast kernels, and its backward
under the counter took 17 s a step at 64 px."""


def loop_img_s(
    boot: Bootstrap, s: Shrunk, out: Path, batch: int, warm: int, steps: int, **spec: Any
) -> tuple[float, float]:
    """(img/s of the steps after ``warm``, peak memory in GiB) of the real loop on the shrunk spec at per-GPU
    ``batch``; ``spec``: loop_spec's precision and deterministic."""
    fresh_memory(boot.device)
    got = loop_run(s.loop_spec(out, batch, warm + steps, **spec), boot, out, warm=warm)
    return float(got.img_s or 0.0), peak_gib(boot.device)


def peak_gib(device: torch.device) -> float:
    """The peak of the GPU's allocations since fresh_memory; on a CPU the process's peak resident size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def plain_img_s(s: Shrunk, dev: torch.device, batch: int, warm: int, steps: int, precision: str = "fp16") -> float:
    """img/s of a plain PyTorch loop: the same model, batch and numerics, no DDP, no hook, no loader; fp16 with
    a GradScaler, bf16 without; a rehearsal's CPU runs fp32, as the CPU ranks do."""
    fresh_memory(dev)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True  # as the loop's default
    model = torchvision.models.resnet50(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    amp = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision] if dev.type == "cuda" else None
    scaler = torch.amp.GradScaler(dev.type, enabled=amp == torch.float16)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    x = torch.randn(batch, 3, s.image_size, s.image_size, device=dev, dtype=amp)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)
    t = 0.0
    for i in range(warm + steps):
        if i == warm:
            sync(dev)
            t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync(dev)
    return steps * batch / (time.perf_counter() - t)


def syncs(s: Shrunk) -> dict[str, Any]:
    """host_syncs: the loop in fp16 with the GradScaler, host syncs per step (check/syncs.py): torch's sync
    debug mode on CUDA; a rehearsal's CPU run counts with the CPU test hosts' counter (tests/synccount.py)."""
    out = s.out / "syncs"
    boot = world_of_one()
    steps, size = (7, 32) if s.rehearsal else (SYNC_STEPS, None)
    counter, counted_by = counter_for(boot.device)
    r = count_loop_syncs(s.loop_spec(out, s.small, steps, image_size=size), boot, out, "fp16-scaler", counter)
    per_step = r["syncs"] / max(r["steps"], 1)
    ok = boot.backend == s.backend and r["steps"] > 0 and per_step == 0
    return {
        "host_syncs": {
            "steps": r["steps"],
            "syncs_per_step": per_step,
            "where": r["where"],
            "backend": boot.backend,
            "counter": counted_by,
            "ok": ok,
        }
    }


def speed(s: Shrunk) -> dict[str, Any]:
    """speed_vs_bare, bf16_vs_fp16, peak_memory: rounds alternating the loop and the bare loop at the large
    batch in fp16 (drift and clocks hurt both alike), one round of each in bf16, the loop's peak at both."""
    out, boot = s.out / "speed", world_of_one()
    warm, steps = (1, 3) if s.rehearsal else (5, 10 if s.quick else 25)
    big, dev = s.large, boot.device
    runs: dict[str, list[float]] = {"ours": [], "bare": []}
    peak: dict[int, float] = {}
    for r in range(1 if s.quick or s.rehearsal else 2):
        for which in ("ours", "bare") if r % 2 == 0 else ("bare", "ours"):
            if which == "ours":
                img_s, peak[big] = loop_img_s(boot, s, out, big, warm, steps, precision="fp16")
                runs["ours"].append(img_s)
            else:
                runs["bare"].append(plain_img_s(s, dev, big, warm, steps, "fp16"))
    bf16 = loop_img_s(boot, s, out, big, warm, steps, precision="bf16")[0]
    bare_bf16 = plain_img_s(s, dev, big, warm, steps, "bf16")
    peak[s.small] = loop_img_s(boot, s, out, s.small, warm, steps, precision="fp16")[1]
    fp16, bare = statistics.median(runs["ours"]), statistics.median(runs["bare"])
    gpu_gib = memory_gib(dev)
    vs_bare = {"batch": big, "torus_train_img_s": fp16, "bare_img_s": bare, "rounds": len(runs["ours"])}
    vs_bare |= {"ratio": fp16 / bare, "ok": fp16 / bare >= 0.90}
    prec = {"bf16_img_s": bf16, "bare_bf16_img_s": bare_bf16, "ratio": bf16 / bare_bf16}
    prec |= {"ok": bf16 / bare_bf16 >= 0.90, "fp16_img_s": fp16, "bf16_over_fp16": bf16 / fp16}
    mem = {"gib_batch_32": peak[s.small], "gib_batch_256": peak[big], "gpu_gib": gpu_gib}
    return {"speed_vs_bare": vs_bare, "bf16_vs_fp16": prec, "peak_memory": mem | {"ok": peak[big] <= 0.9 * gpu_gib}}


def digest(s: Shrunk) -> dict[str, Any]:
    """digest: the same short `torus-train run --deterministic` twice (1x1, synthetic) ends with equal
    parameter digests; and the loop at the large batch with job.deterministic on against off (its cost)."""
    out = s.out / "digest"
    digests, errors = [], []
    for i in (1, 2):
        got, error = deterministic_run(s, out / f"run{i}")
        digests.append(got)
        errors += [error] if error else []
    res: dict[str, Any] = {"first": digests[0], "second": digests[1]}
    res["ok"] = digests[0] is not None and digests[0] == digests[1]
    warm, steps = (1, 3) if s.rehearsal else (5, 15)
    boot = world_of_one()
    res["default_img_s"] = loop_img_s(boot, s, out / "speed", s.large, warm, steps)[0]
    res["deterministic_img_s"] = loop_img_s(boot, s, out / "speed", s.large, warm, steps, deterministic=True)[0]
    res["deterministic_cost"] = res["deterministic_img_s"] / res["default_img_s"]
    if errors:
        res["error"] = " | ".join(errors)
    return {"digest": res}


def deterministic_run(s: Shrunk, run: Path) -> tuple[str | None, str | None]:
    """(param_digest, None) of an 8-step `torus-train run --deterministic`, or (None, its error's tail)."""
    sets = [stages(s.small), "data.synthetic_samples=512", "eval.every_epochs=0", "checkpoint.every_epochs=0"]
    argv = [sys.executable, "-m", "torus_train", "run", "--spec", str(SPEC), "--data", "synthetic", "--out", str(run)]
    argv += ["--epochs", "1", "--steps", "8", "--deterministic", *s.cli_sets([*sets, "checkpoint.at_end=false"])]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode:
        return None, r.stderr[-400:]
    return json.loads((run / "summary.json").read_text()).get("param_digest"), None
