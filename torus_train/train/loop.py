"""The training loop of one rank, as a short sequence of named calls (runs inside torus_train.ranks.worker).

    model     = build_model(spec, device)                 torchvision, channels_last
    ddp       = wrap_ddp(model, spec, boot)               DDP buckets + overlap; the torus hook reduces buckets
    optimizer = build_optimizer(...)                      no weight decay on BatchNorm and biases
    schedule  = build_schedule(spec, world_size)          batch-size stages and LR
    resume(...)                                           latest complete checkpoint, if asked
    for epoch:  stage = schedule.stage_at(epoch); loader = loader_for(stage) (rebuilt on a stage switch)
        for batch:  set_lr(...); train_step(...); log_interval(...); maybe_checkpoint(...)
        evaluate(...) (top-1/top-5 all-reduced)
    check_replicas(model)                                 parameter digest on every rank; fail if they differ
    write_summary(...)
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from torus_train.train import checkpoint as ckpt
from torus_train.ranks.bootstrap import Bootstrap
from torus_train.errors import RunFailed, UserError
from torus_train.job.spec import JobSpec

log = logging.getLogger("torus_train.train.loop")
MAX_NONFINITE_IN_A_ROW = 5


class StopRequested(RunFailed):
    """SIGTERM/SIGINT reached the ranks; they stopped together at a logging interval (after a checkpoint)."""


# Set by the worker's signal handler while the loop runs; the ranks agree on it at the next logging interval
# (a flag in the loss all-reduce), so that they all stop after the same step and can checkpoint together.
stop_signal: str | None = None
in_loop = False


def request_stop(name: str) -> bool:
    """Called from a signal handler: True when the loop will stop by itself, False when the caller must."""
    global stop_signal
    stop_signal = name
    return in_loop


@dataclass
class Position:
    """Where training stands; saved in checkpoints."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    images: int = 0
    """Images consumed so far, over all ranks."""
    seconds: float = 0.0
    """Wall seconds of training before this process started (from a resumed checkpoint)."""
    target_epoch: float | None = None
    target_seconds: float | None = None
    best_top1: float | None = None


@dataclass
class RunState:
    spec: JobSpec
    boot: Bootstrap
    out: Path
    pos: Position = field(default_factory=Position)
    t0: float = 0.0
    """time.time() of the first data touch in this process."""
    nonfinite_in_a_row: int = 0
    stop_agreed: bool = False
    """Some rank got SIGTERM/SIGINT: every rank stops after this logging interval."""
    skipped_steps: int = 0
    last_eval: dict | None = None

    @property
    def rank0(self) -> bool:
        return self.boot.info.rank == 0

    def wall(self) -> float:
        return self.pos.seconds + (time.time() - self.t0 if self.t0 else 0.0)


# --------------------------------------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------------------------------------
def seed_everything(seed: int, rank: int) -> None:
    """Same model initialisation everywhere (seed), rank-specific randomness for the rest."""
    torch.manual_seed(seed)
    random.seed(seed * 1000 + rank)
    try:
        import numpy as np

        np.random.seed((seed * 1000 + rank) % 2**32)
    except ImportError:
        pass


def build_model(spec: JobSpec, device: torch.device) -> nn.Module:
    import torchvision

    try:
        model = torchvision.models.get_model(spec.model.arch, weights=None, num_classes=spec.model.num_classes)
    except ValueError:
        raise UserError(f"model.arch: {spec.model.arch!r} is not a torchvision classification model "
                        "(e.g. resnet18, resnet50)") from None
    model = model.to(device)
    if spec.model.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def wrap_ddp(model: nn.Module, spec: JobSpec, boot: Bootstrap) -> nn.Module:
    """DDP (buckets, overlap with backward) with the gradient exchange of comm.algo as its comm hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, device_ids=[boot.device] if boot.device.type == "cuda" else None,
              bucket_cap_mb=spec.comm.bucket_mb, gradient_as_bucket_view=True)
    compression = None if spec.comm.compression == "none" else spec.comm.compression
    if spec.comm.algo == "ddp":
        if compression:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = default_hooks.fp16_compress_hook if compression == "fp16" else default_hooks.bf16_compress_hook
            ddp.register_comm_hook(None, hook)
        return ddp
    from torus_train.comm.hooks import TorusHookState, allreduce_hook

    state = TorusHookState(boot.groups, algo=spec.comm.algo, compression=compression)
    ddp.register_comm_hook(state, allreduce_hook)
    ddp.torus_hook_state = state  # closed (its exchange thread joined) when training ends
    return ddp


def prime_buckets(ddp: nn.Module, spec: JobSpec, device: torch.device) -> None:
    """One throw-away forward/backward so that DDP rebuilds its buckets now, before the first real step.

    DDP regroups gradients into buckets by their ready order after its first backward. Doing that before
    training (and before a resume loads its checkpoint) gives every run the same buckets from step 1 on, so a
    resumed run sums gradients in the same order as a straight one and ends with the same bits.
    """
    saved = {k: v.clone() for k, v in ddp.module.state_dict().items()}
    size = spec.data.image_size
    x = torch.zeros(2, 3, size, size, device=device)
    if spec.model.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ddp(x).float().sum().backward()
    ddp.module.load_state_dict(saved)  # BatchNorm statistics as they were
    ddp.module.zero_grad(set_to_none=True)


def build_schedule(spec: JobSpec, world_size: int):
    """The spec's BatchSchedule for this world size (the same one `run` printed before starting)."""
    return spec.batch_schedule(world_size)


def data_root(spec: JobSpec) -> str | None:
    """None for synthetic data, the demo set's folder (created if missing) for demo, else the folder."""
    if spec.data.source == "synthetic":
        return None
    if spec.data.source == "demo":
        from torus_train.data.demo import ensure_demo_dataset

        return str(ensure_demo_dataset(seed=0, log=None))
    return spec.data.source


def build_loader(spec: JobSpec, boot: Bootstrap, split: str, per_rank_batch: int):
    from torus_train.data import make_loader

    kind = "synthetic" if spec.data.source == "synthetic" else spec.data.loader
    threads = spec.data.num_threads or max(1, (os.cpu_count() or 1) // boot.info.local_world_size)
    return make_loader(kind, data_root(spec), split, rank=boot.info.rank, world_size=boot.info.world_size,
                       batch_size=per_rank_batch, image_size=spec.data.image_size,
                       num_classes=spec.model.num_classes, seed=spec.job.seed,
                       channels_last=spec.model.channels_last, device=boot.device, num_threads=threads,
                       verify=False, synthetic_samples=spec.data.synthetic_samples or None)


def amp_settings(spec: JobSpec, device: torch.device) -> tuple[torch.dtype | None, Any]:
    """(autocast dtype or None, GradScaler or None). CPU ranks run fp32 (said once by the caller)."""
    if device.type != "cuda" or spec.model.precision == "fp32":
        return None, None
    if spec.model.precision == "bf16":
        return torch.bfloat16, None
    return torch.float16, torch.amp.GradScaler("cuda")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


def grads_finite(model: nn.Module) -> bool:
    """After DDP's all-reduce the gradients are identical on every rank, so every rank decides alike."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return bool(torch.isfinite(torch.stack(norms).sum()).item()) if norms else True


def train_step(ddp: nn.Module, optimizer, loss_fn, images, labels, accumulation: int, amp_dtype, scaler,
               rs: RunState) -> float:
    """One optimizer step over `accumulation` micro-batches; returns the mean loss on this rank."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    xs, ys = images.chunk(accumulation), labels.chunk(accumulation)
    for i, (x, y) in enumerate(zip(xs, ys)):
        last = i == accumulation - 1
        ctx = ddp.no_sync() if not last else _nullcontext()
        with ctx:
            with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = loss_fn(ddp(x), y) / accumulation
            if _fault_here("nan", rs.boot.info.rank, rs.pos.global_step + 1):
                loss = loss * float("nan")  # a non-finite gradient on this rank only
            (scaler.scale(loss) if scaler else loss).backward()
        total += loss.detach().float().item()
    if scaler is not None:
        scaler.step(optimizer)  # skips the step on inf/NaN; identical on every rank after the all-reduce
        scaler.update()
        return total
    if grads_finite(ddp.module):
        optimizer.step()
        rs.nonfinite_in_a_row = 0
    else:
        rs.nonfinite_in_a_row += 1
        rs.skipped_steps += 1
        log.warning("step %d: non-finite gradients, step skipped on every rank", rs.pos.global_step)
        if rs.nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
            raise RunFailed(f"{rs.nonfinite_in_a_row} steps in a row had non-finite gradients (from step "
                            f"{rs.pos.global_step - rs.nonfinite_in_a_row + 1}); lower the LR")
    return total


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def sync_buffers(model: nn.Module) -> None:
    """BatchNorm running statistics from rank 0 (each rank updated its own during the last forward)."""
    for b in model.buffers():
        dist.broadcast(b, 0)


def evaluate(model: nn.Module, loader, amp_dtype) -> dict:
    """Top-1 / top-5 over the whole val split, counts all-reduced (padded samples carry label -1)."""
    model.eval()
    counts = torch.zeros(4, dtype=torch.float64)
    with torch.no_grad():
        for images, labels in loader:
            with torch.autocast(images.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                logits = model(images)
            keep = labels >= 0
            logits, labels = logits[keep].float(), labels[keep]
            top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
            hit = top5 == labels[:, None]
            counts += torch.tensor([hit[:, 0].sum().item(), hit.any(1).sum().item(), labels.numel(),
                                    nn.functional.cross_entropy(logits, labels, reduction="sum").item()
                                    if labels.numel() else 0.0], dtype=torch.float64)
    model.train()
    dev = next(model.parameters()).device
    counts = counts.to(dev)
    dist.all_reduce(counts)
    c1, c5, n, loss = counts.tolist()
    return {"top1": c1 / max(n, 1), "top5": c5 / max(n, 1), "val_loss": loss / max(n, 1), "samples": int(n)}


def param_digest(model: nn.Module) -> str:
    """sha256 over every parameter's bytes, in name order."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def check_replicas(model: nn.Module) -> tuple[str, bool, list[str]]:
    """Every rank's parameter digest, gathered; (this rank's, all agree, all)."""
    mine = param_digest(model)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return mine, len(set(everyone)) == 1, everyone


# --------------------------------------------------------------------------------------------------------
# metrics, progress, checkpoints
# --------------------------------------------------------------------------------------------------------
def write_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Rank 0's progress: one refreshing line on a terminal, a line per interval otherwise."""

    def __init__(self, total_steps: int):
        self.total = total_steps
        self.tty = sys.stdout.isatty()

    def update(self, rs: RunState, rec: dict, steps_left: int, rate_steps: float) -> None:
        eta = steps_left / rate_steps if rate_steps > 0 else 0.0
        line = (f"epoch {rec['epoch'] + 1}/{rs.spec.schedule.epochs} step {rec['step']}/{self.total} | "
                f"{rec['images_per_second']:,.0f} img/s | loss {rec['loss']:.4f} | lr {rec['lr']:.4g} | "
                f"batch {rec['global_batch']} | ETA {_fmt_time(eta)}")
        if self.tty:
            print("\r" + line.ljust(110), end="", flush=True)
        else:
            print(line, flush=True)

    def say(self, text: str) -> None:
        print(("\n" if self.tty else "") + text, flush=True)


def checkpoint_state(ddp: nn.Module, optimizer, scaler, rs: RunState) -> dict | None:
    """Gather every rank's RNG state; rank 0 gets the full state to save, the others None."""
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, rng)
    sync_buffers(ddp.module)
    if not rs.rank0:
        return None
    return {"model": ddp.module.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler else None, "position": vars(rs.pos).copy(),
            "rng": every, "grid": str(rs.boot.grid), "world_size": rs.boot.info.world_size,
            "spec": rs.spec.to_dict()}


def save(ddp, optimizer, scaler, rs: RunState, why: str) -> None:
    # fold the time since the last fold into pos.seconds and restart the clock (counted once)
    rs.pos.seconds, rs.t0 = rs.wall(), time.time()
    state = checkpoint_state(ddp, optimizer, scaler, rs)
    if rs.rank0:
        pt = ckpt.save_checkpoint(rs.out / "checkpoints", rs.pos.global_step, state,
                                  {"epoch": rs.pos.epoch, "step_in_epoch": rs.pos.step_in_epoch,
                                   "world_size": rs.boot.info.world_size, "grid": str(rs.boot.grid), "why": why},
                                  rs.spec.checkpoint.keep)
        log.info("checkpoint %s (%s)", pt, why)
    dist.barrier()  # nobody runs ahead of a checkpoint that is still being written


def resume(ddp, optimizer, scaler, rs: RunState) -> bool:
    """Load the newest intact checkpoint of OUT/checkpoints; every rank reads the same file."""
    ref = ckpt.find_latest(rs.out / "checkpoints", warn=log.warning)
    if ref is None:
        log.info("resume: no checkpoint in %s, starting from scratch", rs.out / "checkpoints")
        return False
    state = ckpt.load_checkpoint(ref)
    ddp.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    rs.pos = Position(**state["position"])
    rng = state.get("rng") or []
    if len(rng) == rs.boot.info.world_size:
        mine = rng[rs.boot.info.rank]
        torch.set_rng_state(mine["torch"])
        random.setstate(mine["python"])
        if mine.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(mine["cuda"])
    else:
        log.warning("resume: checkpoint was written by %d ranks, this job has %d; RNG states start fresh",
                    len(rng), rs.boot.info.world_size)
    log.info("resumed from %s: epoch %d, step %d", ref.path, rs.pos.epoch, rs.pos.global_step)
    return True


# --------------------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------------------
def run_training(spec: JobSpec, boot: Bootstrap, out: Path, resume_run: bool = False) -> dict:
    """Train as the spec says; rank 0 writes metrics.jsonl and summary.json. Returns the summary."""
    from torus_train.train.optim import build_optimizer

    rs = RunState(spec, boot, out)
    world, rank = boot.info.world_size, boot.info.rank
    seed_everything(spec.job.seed, rank)
    model = build_model(spec, boot.device)
    ddp = wrap_ddp(model, spec, boot)
    o = spec.optimizer
    optimizer = build_optimizer(model, o.name, spec.schedule.base_lr, o.momentum, o.weight_decay,
                                nesterov=o.nesterov, trust_coefficient=o.trust_coefficient)
    schedule = build_schedule(spec, world)
    prime_buckets(ddp, spec, boot.device)
    amp_dtype, scaler = amp_settings(spec, boot.device)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=spec.schedule.label_smoothing)
    progress = Progress(0) if rs.rank0 else None
    if rs.rank0 and boot.device.type != "cuda" and spec.model.precision != "fp32":
        progress.say(f"CPU ranks run fp32 (model.precision = {spec.model.precision} applies on GPUs)")
    if resume_run and resume(ddp, optimizer, scaler, rs) and rs.rank0:
        progress.say(f"resumed at epoch {rs.pos.epoch}, step {rs.pos.global_step}")

    metrics = out / "metrics.jsonl"
    loader, loader_batch = None, 0
    val_loader = None
    steps_limit = spec.schedule.steps
    rs.t0 = time.time()
    done = steps_limit and rs.pos.global_step >= steps_limit
    global in_loop
    in_loop = True
    for epoch in range(rs.pos.epoch, spec.schedule.epochs):
        if done:
            break
        stage = schedule.stage_at(epoch)
        if stage.per_rank_batch != loader_batch:  # a stage switch: rebuild the loader for the new batch
            if loader is not None and hasattr(loader, "close"):
                loader.close()
            loader, loader_batch = build_loader(spec, boot, "train", stage.per_rank_batch), stage.per_rank_batch
            event = {"event": "stage", "epoch": epoch, "stage": stage.index, "global_batch": stage.global_batch,
                     "per_rank_batch": stage.per_rank_batch, "accumulation": stage.accumulation,
                     "step": rs.pos.global_step}
            log.info("stage %d from epoch %d: global batch %d, per rank %d (%d x %d)", stage.index, epoch,
                     stage.global_batch, stage.per_rank_batch, stage.micro_batch, stage.accumulation)
            if rs.rank0:
                write_jsonl(metrics, event)
                progress.say(f"stage {stage.index} from epoch {epoch}: global batch {stage.global_batch} = "
                             f"{world} ranks x {stage.per_rank_batch}"
                             + (f" ({stage.accumulation} x {stage.micro_batch})" if stage.accumulation > 1 else ""))
        steps = len(loader)
        if progress:
            progress.total = _total_steps(schedule, spec, loader.num_samples)
        loader.set_epoch(epoch)
        skip = rs.pos.step_in_epoch if epoch == rs.pos.epoch else 0
        interval = {"t": time.time(), "data": 0.0, "steps": 0, "loss": 0.0, "images": 0}
        it = iter(loader)
        for i in range(steps):
            td = time.time()
            images, labels = next(it)
            interval["data"] += time.time() - td
            if i < skip:  # resuming inside an epoch: the same order, so skip what was done
                continue
            lr = schedule.lr_at(epoch + i / steps)
            set_lr(optimizer, lr)
            interval["loss"] += train_step(ddp, optimizer, loss_fn, images, labels, stage.accumulation,
                                           amp_dtype, scaler, rs)
            interval["steps"] += 1
            interval["images"] += stage.global_batch
            rs.pos.global_step += 1
            rs.pos.step_in_epoch = i + 1
            rs.pos.images += stage.global_batch
            _maybe_inject_fault(rank, rs.pos.global_step)
            last = i == steps - 1 or (steps_limit and rs.pos.global_step >= steps_limit)
            if rs.pos.global_step % spec.job.log_every == 0 or last:
                log_interval(rs, interval, epoch, stage, lr, progress, metrics, steps_limit)
                interval = {"t": time.time(), "data": 0.0, "steps": 0, "loss": 0.0, "images": 0}
                if rs.stop_agreed:
                    stop_now(ddp, optimizer, scaler, rs, progress)
            if spec.checkpoint.every_steps and rs.pos.global_step % spec.checkpoint.every_steps == 0 and not last:
                save(ddp, optimizer, scaler, rs, f"every {spec.checkpoint.every_steps} steps")
            if steps_limit and rs.pos.global_step >= steps_limit:
                done = True
                break
        epoch_done = rs.pos.step_in_epoch >= steps
        if epoch_done:
            rs.pos.epoch, rs.pos.step_in_epoch = epoch + 1, 0
        ev = spec.eval.every_epochs
        if epoch_done and ev and ((epoch + 1) % ev == 0 or epoch + 1 == spec.schedule.epochs):
            if val_loader is None:
                val_loader = build_loader(spec, boot, "val", max(1, loader_batch))
            sync_buffers(model)
            result = evaluate(model, val_loader, amp_dtype)
            record_eval(rs, result, epoch, progress, metrics)
        ce = spec.checkpoint.every_epochs
        if epoch_done and ce and (epoch + 1) % ce == 0 and not (done or epoch + 1 == spec.schedule.epochs):
            save(ddp, optimizer, scaler, rs, f"end of epoch {epoch}")
    in_loop = False  # from here a signal ends the rank at once (a signal after the last interval: we finish)
    wall = rs.wall()
    for ld in (loader, val_loader):  # data-loader workers and DALI pipelines go now, not at interpreter exit
        if ld is not None and hasattr(ld, "close"):
            ld.close()
    if spec.checkpoint.at_end:
        save(ddp, optimizer, scaler, rs, "end of training")
    if getattr(ddp, "torus_hook_state", None) is not None:
        ddp.torus_hook_state.close()
    digest, agree, everyone = check_replicas(model)
    summary = {
        "world_size": world, "grid": str(boot.grid), "gpus_per_node": boot.grid.gpus_per_node,
        "backend": boot.backend, "device": boot.device.type, "comm_algo": spec.comm.algo,
        "compression": spec.comm.compression, "model": spec.model.arch, "image_size": spec.data.image_size,
        "steps": rs.pos.global_step, "epochs_done": rs.pos.epoch, "images": rs.pos.images,
        "wall_seconds": round(wall, 3), "images_per_second": round(rs.pos.images / wall, 2) if wall else None,
        "skipped_steps": rs.skipped_steps,
        "val_top1": rs.last_eval["top1"] if rs.last_eval else None,
        "val_top5": rs.last_eval["top5"] if rs.last_eval else None,
        "best_top1": rs.pos.best_top1, "target_top1": spec.eval.target_top1 or None,
        "time_to_target_epoch": rs.pos.target_epoch, "time_to_target_seconds": rs.pos.target_seconds,
        "param_digest": digest, "param_digests_agree": agree,
    }
    if rs.rank0:
        if not agree:
            summary["param_digests"] = everyone
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        progress.say(_summary_text(summary))
    if not agree:
        bad = [r for r, d in enumerate(everyone) if d != everyone[0]]
        raise RunFailed(f"replicas differ after {rs.pos.global_step} steps: ranks {bad} disagree with rank 0's "
                        f"parameter digest")
    return summary


def stop_now(ddp, optimizer, scaler, rs: RunState, progress) -> None:
    """Every rank got here after the same step: checkpoint (when checkpoints are on) and stop."""
    c = rs.spec.checkpoint
    why = f"stopped by {stop_signal or 'a signal on another rank'}"
    if c.every_steps or c.every_epochs or c.at_end:
        save(ddp, optimizer, scaler, rs, why)
        why += f"; checkpoint at step {rs.pos.global_step}, continue with --resume"
    if progress:
        progress.say(why)
    raise StopRequested(why)


def _fault_here(kind: str, rank: int, step: int) -> bool:
    """TORUS_TRAIN_FAULT=KIND:RANK:STEP (tests only): is this the rank and step to fail?"""
    fault = os.environ.get("TORUS_TRAIN_FAULT", "")
    return bool(fault) and fault == f"{kind}:{rank}:{step}"


def _maybe_inject_fault(rank: int, step: int) -> None:
    """TORUS_TRAIN_FAULT=step:R:N kills rank R with SIGKILL after step N; stop:R:N freezes it with SIGSTOP;
    exit0:R:N exits it with code 0 (the launcher's failure tests)."""
    fault = os.environ.get("TORUS_TRAIN_FAULT", "")
    kind, _, where = fault.partition(":")
    if kind in ("step", "stop") and where == f"{rank}:{step}":
        import signal

        os.kill(os.getpid(), signal.SIGKILL if kind == "step" else signal.SIGSTOP)
    if kind == "exit0" and where == f"{rank}:{step}":
        os._exit(0)  # looks like success to a launcher that only checks exit codes


def _total_steps(schedule, spec: JobSpec, num_samples: int) -> int:
    total = sum(schedule.steps_per_epoch(e, num_samples) for e in range(spec.schedule.epochs))
    return min(total, spec.schedule.steps) if spec.schedule.steps else total


def log_interval(rs: RunState, interval: dict, epoch: int, stage, lr: float, progress, metrics: Path,
                 steps_limit: int) -> None:
    """Average the interval's loss over the ranks; rank 0 writes a metrics line and updates the progress."""
    seconds = max(time.time() - interval["t"], 1e-9)
    n = max(interval["steps"], 1)
    t = torch.tensor([interval["loss"] / n, 1.0 if stop_signal else 0.0], dtype=torch.float64,
                     device=rs.boot.device)
    dist.all_reduce(t)
    loss_sum, stops = t.tolist()
    rs.stop_agreed = stops > 0
    rec = {"step": rs.pos.global_step, "epoch": epoch, "global_batch": stage.global_batch,
           "per_rank_batch": stage.per_rank_batch, "lr": lr, "loss": loss_sum / rs.boot.info.world_size,
           "images_per_second": interval["images"] / seconds, "data_time": interval["data"] / n,
           "step_time": seconds / n, "wall_seconds": round(rs.wall(), 3)}
    if not math.isfinite(rec["loss"]):
        log.warning("step %d: loss is %s", rs.pos.global_step, rec["loss"])
    log.info("step %d epoch %d loss %.4f lr %.4g %.1f img/s", rec["step"], epoch, rec["loss"], lr,
             rec["images_per_second"])
    if rs.rank0:
        write_jsonl(metrics, rec)
        left = progress.total - rs.pos.global_step
        progress.update(rs, rec, left, n / seconds)


def record_eval(rs: RunState, result: dict, epoch: int, progress, metrics: Path) -> None:
    rs.last_eval = result
    rs.pos.best_top1 = max(rs.pos.best_top1 or 0.0, result["top1"])
    target = rs.spec.eval.target_top1
    wall = round(rs.wall(), 3)
    if target and rs.pos.target_epoch is None and result["top1"] >= target:
        rs.pos.target_epoch, rs.pos.target_seconds = epoch + 1, wall
    rec = {"event": "eval", "epoch": epoch, "step": rs.pos.global_step, **result, "wall_seconds": wall}
    log.info("eval after epoch %d: top-1 %.4f top-5 %.4f", epoch, result["top1"], result["top5"])
    if rs.rank0:
        write_jsonl(metrics, rec)
        hit = ""
        if target and rs.pos.target_epoch == epoch + 1:
            hit = f" | reached target {target:.2%} at {rs.pos.target_seconds:.1f} s"
        progress.say(f"eval after epoch {epoch + 1}: top-1 {result['top1']:.2%} top-5 {result['top5']:.2%} "
                     f"({result['samples']} images){hit}")


def _summary_text(s: dict) -> str:
    parts = [f"done: {s['steps']} steps on {s['world_size']} ranks (grid {s['grid']}, {s['comm_algo']}) in "
             f"{s['wall_seconds']:.1f} s, {s['images_per_second'] or 0:,.1f} img/s"]
    if s["val_top1"] is not None:
        parts.append(f"val top-1 {s['val_top1']:.2%}")
    if s["time_to_target_seconds"] is not None:
        parts.append(f"target reached at epoch {s['time_to_target_epoch']}, {s['time_to_target_seconds']:.1f} s")
    parts.append(f"replicas agree: {s['param_digests_agree']} ({s['param_digest'][:12]})")
    return "; ".join(parts)
