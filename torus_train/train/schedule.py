"""Batch-size control: the global batch grows in stages, the learning rate follows (pure; no torch import).

Sony's recipe (Mikami et al. 2018) warms up at a small global batch and then grows it, which plays the role
of a learning-rate decay (Smith et al. 2017, "Don't decay the learning rate, increase the batch size").

A schedule is a list of stages; stage i covers epochs [stages[i-1].until_epoch, stages[i].until_epoch).
For each stage:

* per-rank batch = global batch / world size (an error if it does not divide);
* if a per-rank maximum is set and exceeded, the per-rank batch is split into ``accumulation`` micro-batches
  of ``micro_batch`` samples (gradient accumulation), the smallest split that fits;
* peak LR: ``lr_policy="linear"`` scales with the batch, ``base_lr * global_batch / lr_reference_batch``
  (Goyal et al. 2017); ``"constant"`` holds the first stage's peak for every stage, so that growing the batch
  lowers the gradient noise the way a decay would (Smith et al. 2017).

Over the whole run: a linear warm-up over ``warmup_epochs`` from 10% to 100% of the peak, then the decay
(``poly``: power 2 to ``end_lr`` as in MLPerf; ``cosine``; ``step``: times ``step_gamma`` at each of
``step_epochs``; ``none``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from torus_train.errors import UserError

LR_POLICIES = ("linear", "constant")
DECAYS = ("poly", "cosine", "step", "none")
WARMUP_START = 0.1  # warm-up starts at this fraction of the peak: a first step at LR 0 would be wasted


class ScheduleError(UserError):
    """A batch/LR schedule that cannot run; the message names the field path and the bad value."""


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Stage:
    """One batch stage: the global batch used up to (not including) an epoch."""

    until_epoch: int
    """The stage ends when this epoch starts (exclusive); the first stage starts at epoch 0."""
    global_batch: int
    """Samples per optimizer step summed over all ranks."""


class StageInfo(NamedTuple):
    """What the training loop needs at one epoch."""

    index: int
    """Stage number, from 0."""
    global_batch: int
    """Samples per optimizer step over all ranks."""
    per_rank_batch: int
    """Samples per optimizer step on one rank (global batch / world size)."""
    accumulation: int
    """Forward/backward passes per optimizer step (gradient accumulation)."""
    micro_batch: int
    """Samples per forward pass on one rank; per_rank_batch = micro_batch * accumulation."""


@dataclass
class BatchSchedule:
    """Staged global batch and the learning rate that goes with it."""

    stages: Sequence[Stage]
    """Batch stages in epoch order; the last must reach ``epochs``."""
    world_size: int
    """Number of ranks; every global batch must divide by it."""
    epochs: int
    """Length of the run in epochs."""
    base_lr: float = 0.1
    """Learning rate at ``lr_reference_batch`` (0.1 at 256 for ResNet-50 with SGD, Goyal et al.)."""
    lr_reference_batch: int = 256
    """The global batch at which the LR equals ``base_lr``."""
    warmup_epochs: float = 0.0
    """Linear warm-up length in epochs, from 10% to 100% of the peak."""
    lr_policy: str = "linear"
    """How the peak LR follows a batch growth: ``linear`` (scale with the batch) or ``constant`` (hold it)."""
    decay: str = "poly"
    """Decay after warm-up: ``poly`` (power 2), ``cosine``, ``step`` or ``none``."""
    max_per_rank_batch: int = 0
    """Largest per-rank forward batch; above it gradients accumulate over micro-batches (0 = no limit)."""
    end_lr: float = 0.0
    """LR reached at the last epoch by ``poly`` and ``cosine``."""
    poly_power: float = 2.0
    """Exponent of the polynomial decay (2 in MLPerf's ResNet-50 reference)."""
    step_epochs: Sequence[float] = field(default_factory=tuple)
    """Epochs at which ``step`` multiplies the LR by ``step_gamma``; default half and three quarters of the run."""
    step_gamma: float = 0.1
    """Factor applied at each of ``step_epochs``."""
    prefix: str = "schedule"
    """Field path prefix used in error messages (the spec section this schedule came from)."""

    def __post_init__(self) -> None:
        p = self.prefix
        if not _is_int(self.world_size) or self.world_size < 1:
            raise ScheduleError(f"world size must be a positive integer, got {self.world_size!r}")
        if not _is_int(self.epochs) or self.epochs < 1:
            raise ScheduleError(f"{p}.epochs: {self.epochs!r} must be a positive integer")
        if not _is_num(self.base_lr) or self.base_lr <= 0:
            raise ScheduleError(f"{p}.base_lr: {self.base_lr!r} must be a positive number")
        if not _is_int(self.lr_reference_batch) or self.lr_reference_batch < 1:
            raise ScheduleError(f"{p}.lr_reference_batch: {self.lr_reference_batch!r} must be a positive integer")
        if not _is_num(self.warmup_epochs) or not 0 <= self.warmup_epochs < self.epochs:
            raise ScheduleError(f"{p}.warmup_epochs: {self.warmup_epochs!r} must be >= 0 and below "
                                f"{p}.epochs ({self.epochs})")
        if self.lr_policy not in LR_POLICIES:
            raise ScheduleError(f"{p}.lr_policy: {self.lr_policy!r} is not one of {', '.join(LR_POLICIES)}")
        if self.decay not in DECAYS:
            raise ScheduleError(f"{p}.decay: {self.decay!r} is not one of {', '.join(DECAYS)}")
        if not _is_int(self.max_per_rank_batch) or self.max_per_rank_batch < 0:
            raise ScheduleError(f"{p}.max_per_rank_batch: {self.max_per_rank_batch!r} must be an integer >= 0")
        if not _is_num(self.end_lr) or self.end_lr < 0:
            raise ScheduleError(f"{p}.end_lr: {self.end_lr!r} must be a number >= 0")
        if not _is_num(self.poly_power) or self.poly_power <= 0:
            raise ScheduleError(f"{p}.poly_power: {self.poly_power!r} must be a positive number")
        if not _is_num(self.step_gamma) or not 0 < self.step_gamma <= 1:
            raise ScheduleError(f"{p}.step_gamma: {self.step_gamma!r} must be in (0, 1]")
        self.stages = tuple(self._check_stages(self.stages))
        if not self.step_epochs:
            self.step_epochs = (self.epochs / 2, self.epochs * 3 / 4)
        prev = 0.0
        for i, e in enumerate(self.step_epochs):
            if not _is_num(e) or not prev < e < self.epochs:
                raise ScheduleError(f"{p}.step_epochs[{i}]: {e!r} must increase and lie inside (0, {self.epochs})")
            prev = e
        self.step_epochs = tuple(self.step_epochs)
        # Per-stage derived values, computed once (and thereby validated before any rank starts).
        self._infos = [self._derive(i, s) for i, s in enumerate(self.stages)]

    # --- validation ---------------------------------------------------------------------------
    def _check_stages(self, stages: Sequence[Stage]) -> list[Stage]:
        p = f"{self.prefix}.stages"
        if not stages:
            raise ScheduleError(f"{p}: at least one stage is needed")
        out: list[Stage] = []
        prev_end = 0
        for i, s in enumerate(stages):
            if isinstance(s, dict):  # accept plain tables straight from TOML
                unknown = set(s) - {"until_epoch", "global_batch"}
                if unknown:
                    raise ScheduleError(f"{p}[{i}].{sorted(unknown)[0]}: unknown key "
                                        "(a stage has until_epoch and global_batch)")
                if "until_epoch" not in s or "global_batch" not in s:
                    missing = "until_epoch" if "until_epoch" not in s else "global_batch"
                    raise ScheduleError(f"{p}[{i}].{missing}: missing")
                s = Stage(until_epoch=s["until_epoch"], global_batch=s["global_batch"])
            if not _is_int(s.until_epoch) or s.until_epoch < 1:
                raise ScheduleError(f"{p}[{i}].until_epoch: {s.until_epoch!r} must be a positive integer")
            if s.until_epoch <= prev_end:
                raise ScheduleError(f"{p}[{i}].until_epoch: {s.until_epoch} is not after the previous stage's "
                                    f"end ({prev_end}); stages must be in epoch order")
            if prev_end >= self.epochs:
                raise ScheduleError(f"{p}[{i}]: starts at epoch {prev_end}, at or after the end of the run "
                                    f"({self.prefix}.epochs = {self.epochs}), so it would never run")
            if not _is_int(s.global_batch) or s.global_batch < 1:
                raise ScheduleError(f"{p}[{i}].global_batch: {s.global_batch!r} must be a positive integer")
            if s.global_batch % self.world_size:
                raise ScheduleError(f"{p}[{i}].global_batch: {s.global_batch} does not divide by world size "
                                    f"{self.world_size}")
            prev_end = s.until_epoch
            out.append(s)
        if prev_end < self.epochs:
            raise ScheduleError(f"{p}[{len(out) - 1}].until_epoch: {prev_end} ends before the run does "
                                f"({self.prefix}.epochs = {self.epochs}); the last stage must reach it")
        return out

    def _derive(self, i: int, s: Stage) -> StageInfo:
        per_rank = s.global_batch // self.world_size
        accumulation = 1
        if self.max_per_rank_batch and per_rank > self.max_per_rank_batch:
            # The smallest number of equal micro-batches that fits under the limit.
            accumulation = next(a for a in range(2, per_rank + 1)
                                if per_rank % a == 0 and per_rank // a <= self.max_per_rank_batch)
        return StageInfo(i, s.global_batch, per_rank, accumulation, per_rank // accumulation)

    # --- queries ------------------------------------------------------------------------------
    def stage_at(self, epoch: float) -> StageInfo:
        """The stage in force during ``epoch`` (an integer epoch, or a fractional one)."""
        if epoch < 0:
            raise ValueError(f"epoch {epoch} < 0")
        for info, s in zip(self._infos, self.stages):
            if epoch < s.until_epoch:
                return info
        return self._infos[-1]

    def infos(self) -> list[StageInfo]:
        """Every stage's derived values, in order."""
        return list(self._infos)

    def stage_start(self, index: int) -> int:
        """First epoch of stage ``index``."""
        return 0 if index == 0 else self.stages[index - 1].until_epoch

    def switch_epochs(self) -> list[int]:
        """Epochs at which the global batch changes (a new stage starts)."""
        return [self.stages[i - 1].until_epoch for i in range(1, len(self.stages))]

    def peak_lr(self, index: int) -> float:
        """Peak LR of stage ``index`` before warm-up and decay."""
        batch = self.stages[index if self.lr_policy == "linear" else 0].global_batch
        return self.base_lr * batch / self.lr_reference_batch

    def steps_per_epoch(self, epoch: float, num_samples: int) -> int:
        """Optimizer steps in ``epoch`` for a data set of ``num_samples`` (the last batch padded)."""
        return max(1, math.ceil(num_samples / self.stage_at(epoch).global_batch))

    def decay_factor(self, epoch: float) -> float:
        """Multiplier of the decay alone (1 before and during warm-up)."""
        w, e_total = self.warmup_epochs, self.epochs
        if self.decay == "none" or epoch <= w:
            return 1.0
        if self.decay == "step":
            return self.step_gamma ** sum(1 for m in self.step_epochs if epoch >= m)
        t = min(1.0, (epoch - w) / (e_total - w))
        if self.decay == "poly":
            return (1.0 - t) ** self.poly_power
        return 0.5 * (1.0 + math.cos(math.pi * t))  # cosine

    def lr_at(self, epoch: float) -> float:
        """Learning rate at a fractional epoch (``epoch + step / steps_per_epoch``)."""
        if epoch < 0:
            raise ValueError(f"epoch {epoch} < 0")
        peak = self.peak_lr(self.stage_at(epoch).index)
        if self.warmup_epochs and epoch < self.warmup_epochs:
            return peak * (WARMUP_START + (1.0 - WARMUP_START) * epoch / self.warmup_epochs)
        f = self.decay_factor(epoch)
        if self.decay in ("poly", "cosine"):
            end = min(self.end_lr, peak)
            return end + (peak - end) * f
        return peak * f

    def table(self) -> str:
        """A printable stage table: epochs, global and per-rank batch, accumulation, LR at the stage start."""
        head = ("stage", "epochs", "global batch", "per rank", "micro x accum", "peak LR", "LR at start")
        rows = []
        for info in self._infos:
            start = self.stage_start(info.index)
            rows.append((str(info.index), f"{start}-{self.stages[info.index].until_epoch}",
                         str(info.global_batch), str(info.per_rank_batch),
                         f"{info.micro_batch} x {info.accumulation}",
                         f"{self.peak_lr(info.index):.4g}", f"{self.lr_at(start):.4g}"))
        widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(head)]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        lines = [fmt.format(*head)] + [fmt.format(*r) for r in rows]
        decay = self.decay if self.decay != "step" else \
            f"step x{self.step_gamma:g} at epochs {', '.join(f'{e:g}' for e in self.step_epochs)}"
        lines.append(f"world size {self.world_size}; LR {self.base_lr:g} per {self.lr_reference_batch} samples, "
                     f"policy {self.lr_policy}; warm-up {self.warmup_epochs:g} epoch(s); decay {decay}; "
                     f"{self.epochs} epochs")
        return "\n".join(lines)
