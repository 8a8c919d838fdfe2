"""One optimizer step, evaluation, and the replica check (collectives every rank calls alike)."""
from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from torus_train.errors import RunFailed
from torus_train.train.faults import fault_here

log = logging.getLogger("torus_train.train")
MAX_NONFINITE_IN_A_ROW = 5


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


def grads_finite(model: nn.Module) -> bool:
    """After DDP's all-reduce the gradients are identical on every rank, so every rank decides alike.

    One multi-tensor norm kernel per dtype group and one host read per step: the read stays because whether
    optimizer.step runs is decided on the host (as GradScaler does), and a skipped step must be skipped on
    every rank in the same step.
    """
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return True
    norms = torch._foreach_norm(grads)
    return bool(torch.isfinite(torch.stack([n.float() for n in norms]).sum()).item())


def train_step(rs, images, labels, accumulation: int) -> torch.Tensor:
    """One optimizer step over ``accumulation`` micro-batches; returns the mean loss on this rank as a float64
    tensor on the device (read once per logging interval, not per step)."""
    rs.optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64, device=images.device)
    for i, (x, y) in enumerate(zip(images.chunk(accumulation), labels.chunk(accumulation))):
        # DDP exchanges gradients only on the last micro-batch; the others accumulate locally
        with rs.ddp.no_sync() if i < accumulation - 1 else contextlib.nullcontext():
            with torch.autocast(x.device.type, dtype=rs.amp_dtype, enabled=rs.amp_dtype is not None):
                loss = rs.loss_fn(rs.ddp(x), y) / accumulation
            if fault_here("nan", rs.boot.info.rank, rs.pos.global_step + 1):
                loss = loss * float("nan")  # a non-finite gradient on this rank only
            (rs.scaler.scale(loss) if rs.scaler else loss).backward()
        total += loss.detach().float()
    if rs.scaler is not None:
        rs.scaler.step(rs.optimizer)  # skips the step on inf/NaN; identical on every rank after the all-reduce
        rs.scaler.update()
    elif grads_finite(rs.ddp.module):
        rs.optimizer.step()
        rs.nonfinite_in_a_row = 0
    else:
        skip_nonfinite_step(rs)
    return total


def skip_nonfinite_step(rs) -> None:
    rs.nonfinite_in_a_row += 1
    rs.skipped_steps += 1
    log.warning("step %d: non-finite gradients, step skipped on every rank", rs.pos.global_step)
    if rs.nonfinite_in_a_row >= MAX_NONFINITE_IN_A_ROW:
        raise RunFailed(f"{rs.nonfinite_in_a_row} steps in a row had non-finite gradients (from step "
                        f"{rs.pos.global_step - rs.nonfinite_in_a_row + 1}); lower the LR")


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
    counts = counts.to(next(model.parameters()).device)
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
