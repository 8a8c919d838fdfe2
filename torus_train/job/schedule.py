"""Batch-size control: the global batch grows in stages, the learning rate follows (pure; no torch import).

Sony's recipe (Mikami et al. 2018) warms up at a small global batch and then grows it, which plays the role
of a learning-rate decay (Smith et al. 2017, "Don't decay the learning rate, increase the batch size").

``Schedule`` is the spec's ``[schedule]`` section and the one owner of these rules: it validates itself
(``check``) and, bound to a world size (``at``), answers the loop's questions. Stage i covers epochs
[stages[i-1].until_epoch, stages[i].until_epoch); a stage names its batch either per rank (``per_rank_batch``,
which scales with the world size, as Sony kept 32 images per GPU whatever the GPU count) or over all ranks
(``global_batch``, which must divide by the world size). Stages past ``epochs`` are cut and the last one is
stretched to reach it, so ``--epochs`` alone shortens or lengthens any job.

A stage may name its own grid (``grid = "32x34"`` then ``grid = "32x68"``, as Sony grew the GPU count with the
batch): the launcher ends the previous grid's stages with a checkpoint and starts the next grid's ranks from it
(``grid_spans``). A stage's batch is then split over its own grid's ranks, and ``stop_epoch`` tells the ranks
where their grid's stages end, while the learning rate still follows the whole run.

At a world size, for each stage:

* per-rank batch = global batch / world size;
* above ``max_per_rank_batch`` the per-rank batch is split into ``accumulation`` micro-batches of
  ``micro_batch`` samples (gradient accumulation), the smallest split that fits (at most ``MAX_ACCUMULATION``
  passes per step: a split that needs more is refused, found in bounded work whatever the numbers);
* peak LR: ``lr_policy="linear"`` scales with the batch, ``base_lr * global_batch / lr_reference_batch``
  (Goyal et al. 2017); ``"constant"`` holds the first stage's peak for every stage.

Over the whole run: a linear warm-up over ``warmup_epochs`` from 10% to 100% of the peak, then the decay
(``poly``: power 2 to zero as in MLPerf; ``cosine`` to zero; ``step``: x0.1 at half and three quarters of the
run; ``none``).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Sequence

from torus_train.errors import UserError
from torus_train.job.control import CONTROLS
from torus_train.job.topology import parse_grid

LR_POLICIES = ("linear", "constant")
DECAYS = ("poly", "cosine", "step", "none")
WARMUP_START = 0.1  # warm-up starts at this fraction of the peak: a first step at LR 0 would be wasted
POLY_POWER = 2.0  # MLPerf's ResNet-50 reference
STEP_AT = (0.5, 0.75)  # fractions of the run at which `step` decay multiplies the LR by STEP_GAMMA
STEP_GAMMA = 0.1
MAX_ACCUMULATION = 4096
"""Most forward passes (micro-batches) one optimizer step may take: room for a 2,176-GPU global batch of 131,072
on one GPU at micro-batch 32, yet a typo such as max_per_rank_batch = 1 under a huge batch is refused, not run."""
MAX_STAGES = 1000
"""Most batch-size stages: recipes use a handful (Sony's three); the bound keeps every per-stage step cheap."""


class ScheduleError(UserError):
    """A batch/LR schedule that cannot run; the message names the field path and the bad value."""


def steps_per_epoch(num_samples: int, global_batch: int) -> int:
    """Optimizer steps in one epoch over ``num_samples`` (the last step padded): the loaders' length, the
    loop's step count and the progress bar's total all come from here."""
    return max(1, -(-num_samples // global_batch))


@dataclass
class Stage:
    until_epoch: int = 0
    """The stage runs until this epoch starts (exclusive); the first stage starts at epoch 0."""
    per_rank_batch: int = 0
    """Images per optimizer step on each rank; the global batch is this times the world size."""
    global_batch: int = 0
    """Images per optimizer step over all ranks (instead of per_rank_batch; must divide by the world size)."""
    grid: str = ""
    """XxY grid this stage runs on; empty = the job's grid. At a change of grid the launcher checkpoints and
    starts the next stage on the new grid from that checkpoint."""
    earliest_epoch: int = 0
    """schedule.control = "noise": the first epoch this stage may start at; 0 = the first epoch boundary."""
    latest_epoch: int = 0
    """schedule.control = "noise": the stage starts at this epoch at the latest; 0 = the table's epoch (the
    previous stage's until_epoch)."""


class StageInfo(NamedTuple):
    """One stage at a world size: what the training loop needs."""

    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: the stage's number, never called
    """Stage number, from 0."""
    start_epoch: int
    """First epoch of the stage."""
    until_epoch: int
    """The stage ends when this epoch starts."""
    global_batch: int
    """Samples per optimizer step over all ranks."""
    per_rank_batch: int
    """Samples per optimizer step on one rank (global batch / world size)."""
    accumulation: int
    """Forward/backward passes per optimizer step (gradient accumulation)."""
    micro_batch: int
    """Samples per forward pass on one rank; per_rank_batch = micro_batch * accumulation."""
    grid: str = ""
    """The stage's own grid (Stage.grid); empty = the job's."""


@dataclass
class Schedule:
    epochs: int = 5
    """Epochs to train."""
    steps: int = 0
    """Stop after this many optimizer steps (0 = run all epochs); for smoke tests and benchmarks."""
    stages: list[Stage] = field(default_factory=lambda: [Stage(until_epoch=5, per_rank_batch=32)])
    """Batch-size control: [{until_epoch, per_rank_batch or global_batch}, ...] with growing batches."""
    base_lr: float = 0.1
    """Learning rate at lr_reference_batch images per step."""
    lr_reference_batch: int = 256
    """Global batch at which the LR equals base_lr (linear scaling rule)."""
    warmup_epochs: float = 0.0
    """Epochs of linear LR warm-up from 10% of the peak."""
    lr_policy: str = "linear"
    """linear (LR grows with the stage's batch) | constant (same LR for every stage)."""
    decay: str = "poly"
    """LR decay after warm-up: poly | cosine | step | none."""
    max_per_rank_batch: int = 0
    """Largest micro-batch a rank runs in one forward pass (gradient accumulation above it); 0 = no limit."""
    label_smoothing: float = 0.1
    """Label smoothing of the cross-entropy loss."""
    stop_epoch: int = 0
    """Stop (with a checkpoint) when this epoch starts; 0 = at epochs. The learning rate still follows all
    epochs, so --resume continues the same schedule. The launcher sets it to end each grid's stages."""
    control: str = "fixed"
    """When each stage starts: fixed (the table's until_epoch) | noise (when the measured gradient noise
    scale reaches noise_multiple x the stage's global batch, inside its earliest/latest epochs)."""
    noise_multiple: float = 1.0
    """control = "noise": a stage starts once the averaged B_simple reaches this multiple of its global batch
    (1 = the batch where the paper's model spends as many extra steps as extra examples)."""
    stop_stage: int = 0
    """Stop (with a checkpoint) when this stage starts; 0 = never. The launcher sets it to end a grid's stages
    where the control decides their end."""

    def check(self, p: str = "schedule") -> Schedule:
        """Every world-independent rule; raise ScheduleError naming the field path and the bad value."""
        _at_least(f"{p}.epochs", self.epochs, 1)
        _at_least(f"{p}.steps", self.steps, 0)
        _at_least(f"{p}.lr_reference_batch", self.lr_reference_batch, 1)
        _at_least(f"{p}.max_per_rank_batch", self.max_per_rank_batch, 0)
        if not (math.isfinite(self.base_lr) and self.base_lr > 0):
            raise ScheduleError(f"{p}.base_lr: {self.base_lr!r} must be a positive number")
        if not (math.isfinite(self.warmup_epochs) and 0 <= self.warmup_epochs < self.epochs):
            raise ScheduleError(
                f"{p}.warmup_epochs: {self.warmup_epochs!r} must be >= 0 and below {p}.epochs ({self.epochs})"
            )
        if self.lr_policy not in LR_POLICIES:
            raise ScheduleError(f"{p}.lr_policy: {self.lr_policy!r} is not one of {', '.join(LR_POLICIES)}")
        if self.decay not in DECAYS:
            raise ScheduleError(f"{p}.decay: {self.decay!r} is not one of {', '.join(DECAYS)}")
        if not 0 <= self.label_smoothing < 1:
            raise ScheduleError(f"{p}.label_smoothing: {self.label_smoothing!r} must be in [0, 1)")
        if not 0 <= self.stop_epoch <= self.epochs:
            raise ScheduleError(f"{p}.stop_epoch: {self.stop_epoch!r} must be in [0, {p}.epochs ({self.epochs})]")
        self._check_stages(f"{p}.stages")
        if self.control not in CONTROLS:
            raise ScheduleError(f"{p}.control: {self.control!r} is not one of {', '.join(CONTROLS)}")
        problem = CONTROLS[self.control].problem(self, p)
        if problem:
            raise ScheduleError(problem)
        return self

    def _check_stages(self, p: str) -> None:
        if not self.stages:
            raise ScheduleError(f"{p}: at least one stage {{until_epoch, per_rank_batch}} is needed")
        if len(self.stages) > MAX_STAGES:
            raise ScheduleError(f"{p}: {len(self.stages):,} stages; at most {MAX_STAGES:,} (recipes use a handful)")
        prev_end = 0
        for i, s in enumerate(self.stages):
            if (s.per_rank_batch > 0) == (s.global_batch > 0) or min(s.per_rank_batch, s.global_batch) < 0:
                raise ScheduleError(
                    f"{p}[{i}]: give exactly one of per_rank_batch and global_batch, a positive "
                    f"integer (got per_rank_batch {s.per_rank_batch}, global_batch {s.global_batch})"
                )
            if s.until_epoch <= prev_end:
                raise ScheduleError(
                    f"{p}[{i}].until_epoch: {s.until_epoch!r} must be greater than the previous "
                    f"stage's {prev_end} (stages run in order)"
                )
            prev_end = s.until_epoch
            if s.grid:
                try:
                    parse_grid(s.grid)
                except UserError as e:
                    raise ScheduleError(f"{p}[{i}].grid: {e}") from None
            kind = "per_rank_batch" if s.per_rank_batch else "global_batch"
            before = getattr(self.stages[i - 1], kind) if i else 0
            if getattr(s, kind) < before:  # stages of mixed kinds are compared at a world size, in at()
                raise ScheduleError(
                    f"{p}[{i}].{kind}: {getattr(s, kind)} is smaller than the previous stage's "
                    f"{before}; batch-size control only grows the batch"
                )

    def spans(self) -> list[tuple[int, Stage, int, int]]:
        """(index, stage, first epoch, end epoch) of the stages that run: stages past `epochs` are cut and the
        last one is stretched to reach it."""
        out, start = [], 0
        for i, st in enumerate(self.stages):
            if start >= self.epochs:
                break  # a stage past the end of the run never runs
            end = self.epochs if i == len(self.stages) - 1 or st.until_epoch >= self.epochs else st.until_epoch
            out.append((i, st, start, end))
            start = end
        return out

    def grid_spans(self) -> list[tuple[str, int, int]]:
        """(grid, first epoch, end epoch) of each run of consecutive stages on one grid ('' = the job's)."""
        out: list[tuple[str, int, int]] = []
        for _, st, start, end in self.spans():
            if out and out[-1][0] == st.grid:
                out[-1] = (st.grid, out[-1][1], end)
            else:
                out.append((st.grid, start, end))
        return out

    def global_batches(self, world_size: int) -> list[int]:
        """Each stage's global batch at ``world_size`` (a stage with its own grid: at that grid's size), cut
        or not: what the noise control compares the measured noise scale with."""
        return [
            st.global_batch or st.per_rank_batch * (parse_grid(st.grid).size if st.grid else world_size)
            for st in self.stages
        ]

    @property
    def end_epoch(self) -> int:
        """Where the ranks stop: stop_epoch, else epochs."""
        return self.stop_epoch or self.epochs

    def resolved(self, starts: Sequence[int] = ()) -> Schedule:
        """This schedule with each stage's until_epoch where its control puts it, given the starts decided so
        far: the table itself for the fixed control; for the noise control, the undecided stages at their
        latest start."""
        changes = CONTROLS[self.control].resolve(self, list(starts))
        if not any(changes):
            return self
        moved = [dataclasses.replace(st, **c) for st, c in zip(self.stages, changes, strict=True)]
        return dataclasses.replace(self, stages=moved)

    def at(self, world_size: int, starts: Sequence[int] = ()) -> BatchSchedule:
        """This schedule on ``world_size`` ranks, with the stage starts its control decided so far (``starts[k]``
        is the first epoch of stage k + 1); ScheduleError if a stage's batch does not fit."""
        batch = BatchSchedule(self.resolved(starts), world_size)
        problem = CONTROLS[self.control].problem_at(self, batch.stages, world_size)
        if problem:
            raise ScheduleError(problem)
        return batch


@dataclass(frozen=True)
class BatchSchedule:
    """A checked Schedule bound to a world size: stage lookup, per-rank split and the learning rate."""

    schedule: Schedule
    world_size: int
    stages: tuple[StageInfo, ...] = field(init=False, repr=False, compare=False)
    """The stages at this world size (derived from the schedule)."""
    _ends: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ScheduleError(f"world size must be a positive integer, got {self.world_size!r}")
        object.__setattr__(self, "stages", tuple(self._derive()))
        object.__setattr__(self, "_ends", tuple(st.until_epoch for st in self.stages))

    def _derive(self) -> list[StageInfo]:
        out: list[StageInfo] = []
        for i, st, start, end in self.schedule.spans():
            world = parse_grid(st.grid).size if st.grid else self.world_size  # a stage's batch is its grid's
            global_batch = st.global_batch or st.per_rank_batch * world
            if global_batch % world:
                raise ScheduleError(
                    f"schedule.stages[{i}].global_batch: {global_batch} does not divide by world size {world}"
                )
            if out and global_batch < out[-1].global_batch:
                raise ScheduleError(
                    f"schedule.stages[{i}]: global batch {global_batch} is smaller than the "
                    f"previous stage's {out[-1].global_batch}; batch-size control only grows it"
                )
            per_rank = global_batch // world
            acc = _accumulation(per_rank, self.schedule.max_per_rank_batch)
            if acc is None:
                raise ScheduleError(_split_problem(i, per_rank, self.schedule.max_per_rank_batch))
            out.append(StageInfo(i, start, end, global_batch, per_rank, acc, per_rank // acc, st.grid))
        return out

    def stage_at(self, epoch: float) -> StageInfo:
        """The stage in force during ``epoch`` (an integer epoch, or a fractional one)."""
        if epoch < 0:
            raise ValueError(f"epoch {epoch} < 0")
        return self.stages[min(bisect.bisect_right(self._ends, epoch), len(self.stages) - 1)]

    def steps_in_epoch(self, epoch: int, num_samples: int) -> int:
        return steps_per_epoch(num_samples, self.stage_at(epoch).global_batch)

    def total_steps(self, num_samples: int) -> int:
        """Optimizer steps of the whole run, or up to stop_epoch (schedule.steps caps it); one term per stage,
        so a run of 2**31 epochs answers as fast as one of 7."""
        end = self.schedule.end_epoch
        total = sum(
            steps_per_epoch(num_samples, st.global_batch) * (min(st.until_epoch, end) - st.start_epoch)
            for st in self.stages
            if st.start_epoch < end
        )
        return min(total, self.schedule.steps) if self.schedule.steps else total

    def peak_lr(self, index: int) -> float:
        """Peak LR of stage ``index`` before warm-up and decay."""
        s = self.schedule
        return s.base_lr * self.stages[index if s.lr_policy == "linear" else 0].global_batch / s.lr_reference_batch

    def decay_factor(self, epoch: float) -> float:
        """Multiplier of the decay alone (1 before and during warm-up)."""
        s = self.schedule
        if s.decay == "none" or epoch <= s.warmup_epochs:
            return 1.0
        if s.decay == "step":
            return STEP_GAMMA ** sum(1 for f in STEP_AT if epoch >= f * s.epochs)
        t = min(1.0, (epoch - s.warmup_epochs) / (s.epochs - s.warmup_epochs))
        if s.decay == "poly":
            return (1.0 - t) ** POLY_POWER
        return 0.5 * (1.0 + math.cos(math.pi * t))  # cosine

    def lr_at(self, epoch: float) -> float:
        """Learning rate at a fractional epoch (``epoch + step / steps_in_epoch``)."""
        peak = self.peak_lr(self.stage_at(epoch).index)
        w = self.schedule.warmup_epochs
        if w and epoch < w:
            return peak * (WARMUP_START + (1.0 - WARMUP_START) * epoch / w)
        return peak * self.decay_factor(epoch)

    def table(self) -> str:
        """A printable stage table: epochs, global and per-rank batch, accumulation, LR at the stage start."""
        head: tuple[str, ...] = (
            "stage",
            "epochs",
            "global batch",
            "per rank",
            "micro x accum",
            "peak LR",
            "LR at start",
        )
        control = CONTROLS[self.schedule.control]
        if control.rule:  # the epochs are decided while training: the table shows each stage's window
            head = ("stage", "starts in", *head[2:])
        rows: list[tuple[str, ...]] = [
            (
                str(st.index),
                cell,
                str(st.global_batch),
                str(st.per_rank_batch),
                f"{st.micro_batch} x {st.accumulation}",
                f"{self.peak_lr(k):.4g}",
                f"{self.lr_at(st.start_epoch):.4g}" if not (control.rule and k) else "-",
            )
            for k, (st, cell) in enumerate(zip(self.stages, control.cells(self), strict=True))
        ]
        if any(st.grid for st in self.stages):
            head += ("grid",)
            rows = [(*r, st.grid or "job's") for r, st in zip(rows, self.stages, strict=True)]
        widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(head)]
        fmt = "  ".join(f"{{:>{w}}}" for w in widths)
        s = self.schedule
        decay = (
            s.decay
            if s.decay != "step"
            else f"step x{STEP_GAMMA:g} at epochs {', '.join(f'{f * s.epochs:g}' for f in STEP_AT)}"
        )
        return "\n".join(
            [fmt.format(*head)]
            + [fmt.format(*r) for r in rows]
            + [
                f"world size {self.world_size}; LR {s.base_lr:g} per {s.lr_reference_batch} samples, policy "
                f"{s.lr_policy}; warm-up {s.warmup_epochs:g} epoch(s); decay {decay}; {s.epochs} epochs"
            ]
            + ([control.footer(self)] if control.rule else [])
        )


def _split_problem(index: int, per_rank: int, limit: int) -> str:
    low = -(-per_rank // limit)
    need = f" (it would take {low:,})" if low > MAX_ACCUMULATION else ""
    return (
        f"schedule.stages[{index}]: a per-rank batch of {per_rank:,} does not split into at most "
        f"{MAX_ACCUMULATION:,} equal micro-batches of at most {limit:,} samples (schedule.max_per_rank_batch)"
        f"{need}; raise schedule.max_per_rank_batch or choose a per-rank batch that such micro-batches divide"
    )


def _at_least(path: str, value: int, low: int) -> None:
    if value < low:
        raise ScheduleError(f"{path}: {value!r} must be >= {low}")


def _accumulation(per_rank: int, limit: int) -> int | None:
    """The smallest number of equal micro-batches of at most ``limit`` samples (1 when there is no limit), or
    None when that takes more than MAX_ACCUMULATION passes. Bounded work whatever the numbers: the split
    needs at least ceil(per_rank / limit) passes, so only divisors from there up to the cap are tried."""
    if not limit or per_rank <= limit:
        return 1
    low = -(-per_rank // limit)
    return next((a for a in range(low, min(per_rank, MAX_ACCUMULATION) + 1) if per_rank % a == 0), None)
