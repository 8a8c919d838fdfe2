"""The acceptance part `graphs`: the loop (the shrunk production spec) with its step replayed as a CUDA graph
against the same loop eager, a bare eager step, and the ceiling, the bare step with the torus's three NCCL
phases captured whole in one graph (throughput.py), at per-GPU batch 16, 32 and 256, rounds alternating; and
the graphed step against the eager one (graphs.agree). A rehearsal runs it on the CPU at batch 2, 4 and 8:
nothing is captured there (capture_seconds 0.0, every column eager); it checks the part, not the speed.
Imports torch."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torus_train.check.shrunk import Shrunk
from torus_train.check.smallrun import loop_run, world_of_one
from torus_train.check.throughput import PASS as GPU_PASS
from torus_train.check.throughput import Setting, alternating, bare_img_s, fresh_memory
from torus_train.job.rank import Bootstrap
from torus_train.train.graphs import AGREE_TOLERANCE, max_rel_diff

EAGER_PASS = 0.90
"""ours_eager / bare_eager at batch 32 (the second batch) at least this."""


@dataclass(frozen=True)
class Timing:
    """What graphs times: the batches, steps before (more than the loop's warm-up and probe) and in the
    timing, rounds, and the bare step's setting."""

    batches: tuple[int, ...]
    warm: int
    steps: int
    rounds: int
    bare: Setting

    @classmethod
    def of(cls, s: Shrunk) -> Timing:
        warm, steps = (5, 2) if s.rehearsal else (8, 10 if s.quick else 20)
        batches = (2, 4, 8) if s.rehearsal else (16, 32, 256)
        rounds = 1 if s.quick or s.rehearsal else 2
        return cls(batches, warm, steps, rounds, Setting("resnet50", s.image_size, 1000, warm, steps, 1))


def ours(boot: Bootstrap, s: Shrunk, t: Timing, batch: int, graphs: bool) -> tuple[float, float]:
    """img/s of the loop's steps after the warm-up (train/loop.py, in process), and its capture seconds."""
    fresh_memory(boot.device)
    out = s.out / "graphs"
    spec = s.loop_spec(out, batch, t.warm + t.steps)
    spec.model.cuda_graphs = "auto" if graphs else "off"
    got = loop_run(spec, boot, out, warm=t.warm)
    if graphs and not s.rehearsal and not got.capture_seconds:
        raise RuntimeError("the loop did not keep its graph (model.cuda_graphs = auto on NCCL): see its log")
    return float(got.img_s or 0.0), sum(got.capture_seconds)


def measure(boot: Bootstrap, s: Shrunk, t: Timing, batch: int, pass_line: float) -> dict[str, Any]:
    """One batch's row: the four columns' median img/s, ratio (ours graphed / bare graphed), capture seconds."""
    capture: list[float] = []

    def graphed() -> float:
        img_s, seconds = ours(boot, s, t, batch, True)
        capture.append(seconds)
        return img_s

    row: dict[str, Any] = alternating(
        {
            "ours_graphed_img_s": graphed,
            "ours_eager_img_s": lambda: ours(boot, s, t, batch, False)[0],
            "bare_eager_img_s": lambda: bare_img_s(boot, batch, t.bare, graphed=False),
            "bare_graphed_img_s": lambda: bare_img_s(boot, batch, t.bare, graphed=True),
        },
        t.rounds,
    )
    row["ratio"] = round(row["ours_graphed_img_s"] / row["bare_graphed_img_s"], 3)
    row["capture_seconds"] = round(statistics.median(capture), 3)
    row["ok"] = row["ratio"] >= pass_line
    return row


def trained(boot: Bootstrap, s: Shrunk, batch: int, steps: int, graphs: bool, poison_at: int | None = None) -> dict:
    """The loop's parameters after ``steps`` deterministic steps, graphed or eager; with ``poison_at``, that
    step's batch is all NaN, and whether it left the parameters as they were."""
    got: dict[str, Any] = {}

    def params_of(rs: Any) -> torch.Tensor:
        return torch.cat([p.detach().float().reshape(-1) for p in rs.ddp.module.parameters()]).cpu()

    def around(step: Callable) -> Callable:
        def poisoned(rs: Any, images: torch.Tensor, labels: torch.Tensor, accumulation: int) -> torch.Tensor:
            if rs.pos.global_step != poison_at:
                return step(rs, images, labels, accumulation)
            before = params_of(rs)
            loss = step(rs, torch.full_like(images, float("nan")), labels, accumulation)
            got["unchanged"] = bool(torch.equal(before, params_of(rs)))
            return loss

        return poisoned

    out = s.out / "graphs"
    spec = s.loop_spec(out, batch, steps, deterministic=True)
    spec.model.cuda_graphs = "auto" if graphs else "off"
    run = loop_run(spec, boot, out, around=around)
    return got | {"params": run.params, "skipped": run.skipped}


def agreement(boot: Bootstrap, s: Shrunk, batch: int) -> dict[str, Any]:
    """graphs.agree: the graphed step against the eager one, two graphed runs bit for bit, and a replayed step
    fed NaN skipped (parameters unchanged, counted once more than the same run unpoisoned counts: fp16's loss
    scaler may skip a step of its own at its first scale, 2^16, and that is no fault)."""
    steps = 6 if s.rehearsal else 12  # the loop's 3 eager warm-up steps, then the probe and replays
    eager, first, second = (trained(boot, s, batch, steps, g) for g in (False, True, True))
    poisoned = trained(boot, s, batch, steps, True, poison_at=steps - 2)
    rel = max_rel_diff(eager["params"], first["params"])
    res = {
        "batch": batch,
        "steps": steps,
        "eager_vs_graphed_max_rel": rel,
        "graphed_runs_equal": bool(torch.equal(first["params"], second["params"])),
        "nonfinite_step_skipped": bool(poisoned.get("unchanged")) and poisoned["skipped"] == first["skipped"] + 1,
        "skipped": {"unpoisoned": first["skipped"], "poisoned": poisoned["skipped"]},
        "all_finite": all(bool(torch.isfinite(r["params"]).all()) for r in (eager, first, second, poisoned)),
    }
    ok = rel <= AGREE_TOLERANCE and res["graphed_runs_equal"] and res["nonfinite_step_skipped"]
    return res | {"ok": ok and res["all_finite"]}


def graphs(s: Shrunk) -> dict[str, Any]:
    """graphs: a row per batch (GPU pass lines 0.85 at 16 and 32, 0.95 at 256), the eager ratio at the second
    batch, the agreement at it."""
    boot, t = world_of_one(), Timing.of(s)
    rows = {str(b): measure(boot, s, t, b, line) for b, line in zip(t.batches, GPU_PASS.values(), strict=True)}
    at = rows[str(t.batches[1])]  # batch 32 (4 in a rehearsal)
    eager_ratio = round(at["ours_eager_img_s"] / at["bare_eager_img_s"], 3)
    agree = agreement(boot, s, t.batches[1])
    ok = all(r["ok"] for r in rows.values()) and eager_ratio >= EAGER_PASS and agree["ok"]
    return {"graphs": {"batches": rows, "eager_ratio_batch_32": eager_ratio, "agree": agree, "ok": ok}}
