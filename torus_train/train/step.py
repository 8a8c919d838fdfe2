"""One optimizer step, evaluation, and the replica check (collectives every rank calls alike)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn as nn

from torus_train.comm.buckets import broadcast_from_rank0
from torus_train.errors import RunFailed
from torus_train.train.optim import DeviceLR

log = logging.getLogger("torus_train.train")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The LR of every group: written into the optimizer's device tensor where it has one (train/optim.py:
    a captured step reads it there), else the group's float."""
    written = set()
    for g in optimizer.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            if id(g["lr"]) not in written:  # the groups share one tensor: one fill
                g["lr"].fill_(lr)
                written.add(id(g["lr"]))
        else:
            g["lr"] = lr


def set_step(rs, step: int) -> None:
    """The number of the step about to run, in the device tensor the skip counts read (count_skips)."""
    if getattr(rs, "step_now", None) is not None:
        rs.step_now.fill_(step)


def nonfinite_flag(model: nn.Module) -> torch.Tensor:
    """1.0 when any gradient holds inf/NaN, else 0.0: a 0-dim float32 tensor on the gradients' device, never
    read by the host here. After DDP's all-reduce the gradients are identical on every rank, so every rank
    gets the same flag and skips the same steps."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    norms = torch._foreach_norm(grads)  # one multi-tensor kernel per dtype group
    return (~torch.isfinite(torch.stack([n.float() for n in norms]).sum())).float()


def step_unless(optimizer: DeviceLR, found_inf: torch.Tensor) -> None:
    """optimizer.step(), which changes nothing where found_inf is 1: the optimizer reads the flag on the device
    (train/optim.py), the contract GradScaler uses for optimizers with _step_supports_amp_scaling."""
    optimizer.found_inf, optimizer.grad_scale = found_inf, None
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf, optimizer.grad_scale


def train_step(rs, images, labels, accumulation: int) -> torch.Tensor:
    """One optimizer step over ``accumulation`` micro-batches; returns the mean loss on this rank as a float64
    tensor on the device (read once per logging interval, not per step). With CUDA graphs (rs.graphs,
    train/graphs.py) the step is replayed from its capture; else step_body runs eagerly."""
    graphs = getattr(rs, "graphs", None)
    if graphs is not None:
        return graphs.step(rs, images, labels, accumulation)
    return step_body(rs, images, labels, accumulation)


def step_body(rs, images, labels, accumulation: int) -> torch.Tensor:
    """The step itself, eager or captured alike: no host read and nothing decided by the host per step.

    zero the gradient buckets; forward and backward per micro-batch (the buckets' exchange starts during the
    last backward, comm/buckets.py); join the exchange; the update, which skips a step with non-finite
    gradients on the device (the GradScaler's found_inf with fp16, nonfinite_flag otherwise) and counts it on
    the device (count_skips); check_nonfinite reads the counts at each logging interval and before anything
    is saved. The noise scale's averages (rs.noise, train/noise.py) take the step's two squared gradient norms
    on the device: each rank's rides in the exchange (the buckets' stats slot). The LR and the step number come from device tensors the loop writes before the step."""
    dp = rs.ddp
    dp.zero_grad()
    noise = getattr(rs, "noise", None)
    total = torch.zeros((), dtype=torch.float64, device=images.device)
    for i, (x, y) in enumerate(zip(images.chunk(accumulation), labels.chunk(accumulation), strict=True)):
        # the exchange runs on the last micro-batch only; the others accumulate locally
        with dp.no_sync() if i < accumulation - 1 else contextlib.nullcontext():
            # no autocast cache: a cast weight cached across a capture's boundary would be a stale tensor
            with torch.autocast(
                x.device.type, dtype=rs.amp_dtype, enabled=rs.amp_dtype is not None, cache_enabled=False
            ):
                loss = rs.loss_fn(dp(x), y) / accumulation
            scaled = rs.scaler.scale(loss) if rs.scaler else loss
            dp.stats_scale = loss_scale(rs)  # made by the first scale() of a run; the same tensor after
            scaled.backward()
        if noise is not None:  # one rank with accumulation: the micro-batch is the small batch
            noise.micro(dp, i, accumulation)
        total += loss.detach().float()
    dp.finish()
    measured = noise.measure(dp, loss_scale(rs)) if noise is not None else None  # before the scaler updates
    if rs.scaler is not None:
        # LARS and SGD take found_inf and the scale themselves: GradScaler.step reads nothing back
        rs.scaler.step(rs.optimizer)
        found = sum(v.float() for v in rs.scaler._found_inf_per_device(rs.optimizer).values())
        rs.scaler.update()
    else:
        found = nonfinite_flag(dp.module)
        step_unless(rs.optimizer, found)
    count_skips(rs, found)
    if noise is not None:
        noise.update(measured, found, images.shape[0], accumulation)  # a skipped step leaves the averages as they were
    return total


def loss_scale(rs) -> torch.Tensor | None:
    """The GradScaler's scale tensor (the factor in this step's gradients), None without loss scaling."""
    return getattr(rs.scaler, "_scale", None) if rs.scaler is not None else None


SKIP_COUNTS = ("in a row now", "total", "last skipped step", "step the limit was reached")


def count_skips(rs, found: torch.Tensor) -> None:
    """Count a skipped step (found > 0) on the device, as SKIP_COUNTS; check_nonfinite reads them. The step
    number is the device tensor rs.step_now (set_step), or the host's count where there is none."""
    skipped = found > 0
    if rs.skip_counts is None:
        rs.skip_counts = torch.zeros(len(SKIP_COUNTS), dtype=torch.int64, device=found.device)
    step = getattr(rs, "step_now", None)
    c, limit = rs.skip_counts, rs.spec.job.max_nonfinite_steps
    step = rs.pos.global_step + 1 if step is None else step
    c[0] = (c[0] + 1) * skipped
    c[1] += skipped
    c[2] = torch.where(skipped, step, c[2])
    c[3] = torch.where((c[0] == limit) & (c[3] == 0), step, c[3])


def check_nonfinite(rs) -> None:
    """Read the skip counts (one host read, at a logging interval or before a check or checkpoint): a warning
    for the steps skipped since the last read, RunFailed when job.max_nonfinite_steps were skipped in a row."""
    if rs.skip_counts is None:
        return
    now, total, last, reached = rs.skip_counts.tolist()
    new = total - rs.skipped_steps
    rs.skipped_steps, rs.nonfinite_in_a_row = total, now
    limit = rs.spec.job.max_nonfinite_steps
    if reached:
        raise RunFailed(
            f"{limit} steps in a row had non-finite loss or gradients (steps {reached - limit + 1}-"
            f"{reached}, skipped on every rank; job.max_nonfinite_steps = {limit}); nothing was saved "
            "from them; lower the LR"
        )
    if new > 0:
        log.warning(
            "%d step(s) with non-finite gradients skipped on every rank by step %d (the last at step %d)",
            new,
            rs.pos.global_step,
            last,
        )


def sync_buffers(model: nn.Module) -> None:
    """BatchNorm running statistics from rank 0 (each rank updated its own during the last forward), in one
    broadcast (about 160 buffers in ResNet-50)."""
    broadcast_from_rank0(list(model.buffers()))


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
            counts += torch.tensor(
                [
                    hit[:, 0].sum().item(),
                    hit.any(1).sum().item(),
                    labels.numel(),
                    nn.functional.cross_entropy(logits, labels, reduction="sum").item() if labels.numel() else 0.0,
                ],
                dtype=torch.float64,
            )
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


_MASK = (1 << 62) - 1  # digests stay positive and negatable in int64 (one all-reduce of v and -v)
CHECKED = (
    "parameters",
    "parameters",
    "non-finite parameters",
    "global step",
    "epoch",
    "step in epoch",
    "images consumed",
    "batch-size stage starts",
)


def bit_digest(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Two int64 sums over the tensors' bytes read as 64-bit words (each tensor's weighted by its index, and
    the words' squares), wrapping: any changed bit changes the word, so the sum, and integer sums do not
    depend on the order of summation, so equal replicas give equal digests on every device. The bytes are
    read as int64 words without a copy (resnet18 on one CPU thread: about 45 ms, 5x less than widening each
    element to int64; sha256 of the same bytes took 55 ms)."""
    d = torch.zeros(2, dtype=torch.int64, device=tensors[0].device if tensors else "cpu")
    for i, t in enumerate(tensors):
        raw = t.detach().reshape(-1).view(torch.uint8)
        if raw.storage_offset() % 8:  # a view into a shared flat buffer, not at a word boundary
            raw = raw.clone()
        whole = raw.numel() // 8 * 8
        words = raw[:whole].view(torch.int64)
        tail = raw[whole:].to(torch.int64)  # under 8 bytes
        d[0] += (words.sum() + tail.sum()) * (i + 1)
        d[1] += (words * words).sum() + (tail * tail).sum()
    return d


def all_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    floats = [t.detach() for t in tensors if t.dtype.is_floating_point]
    if not floats:
        return torch.ones((), dtype=torch.bool)
    return torch.isfinite(torch.stack([n.float() for n in torch._foreach_norm(floats)])).all()


def replica_vector(model: nn.Module, pos, buffers: bool) -> torch.Tensor:
    """This rank's [digest (2), non-finite flag, global_step, epoch, step_in_epoch, images, stage starts] as
    int64."""
    tensors: list[torch.Tensor] = [p for _, p in sorted(model.named_parameters())]
    if buffers:  # BatchNorm statistics are per rank while training; compared only after sync_buffers
        tensors += [b for _, b in sorted(model.named_buffers())]
    digest = bit_digest(tensors) & _MASK
    device = digest.device
    bad = (~all_finite(tensors)).to(torch.int64).reshape(1).to(device)
    # the stages the control started, as one integer: every rank decided them alone, from the same bits
    starts = sum((k + 1) * (e + 1) << (8 * (k % 7)) for k, e in enumerate(pos.stage_starts))
    where = torch.tensor(
        [pos.global_step, pos.epoch, pos.step_in_epoch, pos.images, starts & _MASK], dtype=torch.int64, device=device
    )
    return torch.cat([digest, bad, where])


def check_replicas(rs, when: str, buffers: bool = False) -> None:
    """Every rank holds the same parameters (and buffers), at the same step and data position, and they are
    finite: one all-reduce (MIN over v and -v) of 16 integers; RunFailed on every rank alike otherwise, naming
    the ranks that differ (a second, small all-gather only then). Call before anything is saved."""
    check_nonfinite(rs)
    v = replica_vector(rs.model, rs.pos, buffers)
    both = torch.cat([v, -v])
    dist.all_reduce(both, op=dist.ReduceOp.MIN)
    low, high = both[: len(v)], -both[len(v) :]
    differ = (low != high).tolist()
    step = rs.pos.global_step
    if any(differ):
        every = [torch.empty_like(v) for _ in range(dist.get_world_size())]
        dist.all_gather(every, v)
        rows = [tuple(t.tolist()) for t in every]
        usual = Counter(rows).most_common(1)[0][0]
        odd = [r for r, row in enumerate(rows) if row != usual]
        what = sorted({CHECKED[i] for i, d in enumerate(differ) if d}, key=CHECKED.index)
        raise RunFailed(
            f"replicas differ at step {step} ({when}): rank(s) {_ranks(odd)} disagree with the "
            f"other {len(rows) - len(odd)} in {', '.join(what)}; nothing was saved"
        )
    if int(high[2].item()):
        raise RunFailed(
            f"parameters are non-finite at step {step} ({when}) on every rank; nothing was saved; "
            "lower the LR or check the optimizer settings"
        )


def _ranks(ranks: list[int], limit: int = 16) -> str:
    text = ", ".join(map(str, ranks[:limit]))
    return text + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")
