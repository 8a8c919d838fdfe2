"""What a batch is worth: the paper's steps/examples model fed with a measured noise scale, and the lines that
say a schedule cannot learn (pure; no torch import).

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv 1812.06162): training to a given
loss at batch B takes S = S_min (1 + B_crit/B) steps and E = E_min (1 + B/B_crit) examples, so
(S/S_min - 1)(E/E_min - 1) = 1, with B_crit = E_min/S_min. The noise scale B_simple = tr(Sigma)/|G|^2, which
every run measures inside its gradient exchange (metrics.jsonl ``noise_scale``), predicts B_crit. Where that
is rough, said wherever a prediction is printed (ROUGH): B_simple equals the paper's B_noise only when the
Hessian is a multiple of the identity, and the paper's fit of B_crit against the averaged noise scale is good
to an order of magnitude (r^2 = 80% across tasks spanning six orders of magnitude); the model assumes the LR
is tuned for each batch; a small run's B_simple at an epoch stands for the large run's at the same fraction
of training, which holds only as far as both reach the same loss there (the noise scale follows the loss).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GOYAL_BATCH = 8192
"""Goyal et al. 2017 (arXiv 1706.02677): linear LR scaling with momentum SGD kept ResNet-50's accuracy up to
a global batch of about 8K and lost it beyond (their Fig. 1); LARS (arXiv 1708.03888) went to 32K."""

ROUGH = (
    "rough: B_simple stands in for B_crit (the paper: an order-of-magnitude guide, equal to B_noise only for "
    "a well-conditioned Hessian), the model assumes a tuned LR at each batch, and the measure is taken from "
    "the reference run at the same fraction of training"
)


@dataclass(frozen=True)
class Cost:
    """What a global batch costs by the model, against the minima (S_min steps, E_min examples)."""

    batch: int
    b_crit: float
    """The critical batch assumed (a measured B_simple)."""

    @property
    def steps(self) -> float:
        """S / S_min = 1 + B_crit / B."""
        return 1.0 + self.b_crit / self.batch

    @property
    def examples(self) -> float:
        """E / E_min = 1 + B / B_crit."""
        return 1.0 + self.batch / self.b_crit

    def text(self) -> str:
        return (
            f"global batch {self.batch:,} against B_crit ~ {self.b_crit:,.0f}: {self.steps:.2f}x the fewest steps, "
            f"{self.examples:.2f}x the fewest examples ({100 / self.examples:.3g}% of the examples do work)"
        )


@dataclass(frozen=True)
class NoisePoint:
    """One measured value: where in training (fraction of the run's epochs) and the averaged B_simple."""

    fraction: float
    noise_scale: float


def curve(records: Sequence[dict], epochs: int) -> list[NoisePoint]:
    """The measured B_simple of a run's metrics lines (those that carry a finite, positive ``noise_scale``)
    at their fraction of the run: epoch + 1/2 of the line's epoch over the run's epochs (a line stands for
    its epoch; the report's plot places lines at their step instead)."""
    out = []
    for r in records:
        b = r.get("noise_scale")
        if isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) and b > 0:
            out.append(NoisePoint(min(1.0, (r["epoch"] + 0.5) / max(epochs, 1)), float(b)))
    return out


def averaged(points: Sequence[NoisePoint]) -> float | None:
    """The noise scale averaged over training, each point weighted alike (the paper fits B_crit against
    the noise scale "appropriately averaged over training"); None without points."""
    return sum(p.noise_scale for p in points) / len(points) if points else None


def over(points: Sequence[NoisePoint], start: float, end: float) -> float | None:
    """The mean B_simple measured between two fractions of training; the nearest earlier value when none
    falls inside, None when nothing was measured before ``end``."""
    inside = [p.noise_scale for p in points if start <= p.fraction < end]
    if inside:
        return sum(inside) / len(inside)
    before = [p for p in points if p.fraction < end]
    return before[-1].noise_scale if before else None


def prediction_lines(points: Sequence[NoisePoint], batches: Sequence[int]) -> list[str]:
    """`report RUN --batch N`: each batch's cost by the model, from B_simple averaged over the run and from
    its last value (the noise scale rises as the loss falls: the last is the one for the end of training)."""
    if not points:
        return ["no noise_scale in metrics.jsonl: nothing to predict from (a run writes it once it is defined)"]
    mean, last = averaged(points), points[-1].noise_scale
    assert mean is not None
    lines = [f"B_simple measured: {len(points)} values, {min(p.noise_scale for p in points):,.0f} to "]
    lines[0] += f"{max(p.noise_scale for p in points):,.0f}, averaged over the run {mean:,.0f}, last {last:,.0f}"
    for b in batches:
        lines.append(f"averaged: {Cost(b, mean).text()}")
        lines.append(f"last:     {Cost(b, last).text()}")
    lines.append(ROUGH)
    return lines


def stage_lines(points: Sequence[NoisePoint], batch: Any, where: str) -> list[str]:
    """`run --dry-run --noise-from RUN`: each stage's batch against the reference run's B_simple over the same
    fraction of training. ``batch``: the job's BatchSchedule."""
    epochs = batch.schedule.epochs
    lines = [f"# predicted efficiency of each stage's batch (noise scale from {where})"]
    for st in batch.stages:
        b = over(points, st.start_epoch / epochs, st.until_epoch / epochs)
        if b is None:
            lines.append(f"stage {st.index}: no B_simple measured by then in {where}")
            continue
        lines.append(f"stage {st.index} (epochs {st.start_epoch}-{st.until_epoch}): {Cost(st.global_batch, b).text()}")
    lines.append(ROUGH)
    return lines


def learnability_lines(spec: Any, batch: Any, images_per_epoch: int | None) -> list[str]:
    """Warnings (the run still starts) for a schedule that cannot learn as planned: a global batch past the
    data set, and linear LR scaling with plain SGD far past where it is known to hold."""
    lines = []
    big = [st for st in batch.stages if images_per_epoch and st.global_batch > images_per_epoch]
    if big and images_per_epoch:
        top = max(big, key=lambda st: st.global_batch)
        lines.append(
            f"warning: stage(s) {', '.join(str(st.index) for st in big)} take a global batch larger than the "
            f"{images_per_epoch:,} training images (up to {top.global_batch:,}, {top.global_batch / images_per_epoch:.1f}x): "
            "an epoch is one step that sees every image more than once; use a smaller per-rank batch "
            "(schedule.stages), fewer ranks, or a larger data set"
        )
    s = batch.schedule
    far = [st for st in batch.stages if st.global_batch > GOYAL_BATCH]
    if spec.optimizer.name == "sgd" and s.lr_policy == "linear" and far:
        k = max(range(len(batch.stages)), key=lambda i: batch.stages[i].global_batch)
        lines.append(
            f"warning: linear LR scaling with plain SGD up to a global batch of {batch.stages[k].global_batch:,} "
            f"(peak LR {batch.peak_lr(k):.4g}); Goyal et al. 2017 found it holds to about {GOYAL_BATCH:,}: use "
            'optimizer.name = "lars" (layer-wise trust ratios, as for 32K), a smaller per-rank batch, or a '
            "larger data set"
        )
    return lines
