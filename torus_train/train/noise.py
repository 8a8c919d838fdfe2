"""The gradient noise scale B_simple = tr(Sigma)/|G|^2 (McCandlish et al. 2018, arXiv 1812.06162, App. A.1) on
every step, from two squared gradient norms taken at the same parameters, at no extra collective:

  1. small batch: each rank's squared gradient norm |g_r|^2 before the exchange (B_small = the rank's whole
     batch, micro-batch x accumulation). It rides in the gradient exchange itself, one element appended to
     the last bucket (comm/buckets.py, ``stats``), so the all-reduce that averages the gradients hands every
     rank the mean over ranks, s = mean_r |g_r|^2, on every algorithm (torus, flat, hierarchical, ddp, NCCL);
  2. big batch: the squared norm of the exchanged gradient, q = |g|^2 (B_big = the global batch), computed
     locally from the averaged buckets, which are the same bits on every rank;
  3. both divided by the square of the loss scale that made this step's gradients; then the unbiased estimates
         |G|^2    = (B_big q - B_small s) / (B_big - B_small)
         tr(Sigma) = (s - q) / (1/B_small - 1/B_big)
     each go into its own moving average (the ratio of two unbiased estimates is not unbiased, the ratio of
     their averages converges), decayed per example: a step of B_big examples weighs the past by
     exp(-B_big / tau), tau = noise.average_epochs x the train split, so a stage change keeps them;
  4. a step whose gradients or estimates are not finite (a skipped step) leaves the averages as they were.
Everything stays on the device (no host read in the step, capturable in the step's CUDA graph); every rank
computes the same bits from the same inputs, so every rank holds the same averages and a decision taken from
them needs no broadcast. ``read`` is the one host read, at logging intervals and stage changes.

The gradient is the one the optimizer gets before weight decay: the mean over the batch of the per-example
gradient of the training loss (cross-entropy with the spec's label smoothing, reduction mean, divided by the
accumulation count per micro-batch). With BatchNorm in training mode a per-example gradient depends on its
micro-batch, so Sigma is the covariance of those. One rank with accumulation takes the micro-batch as the small
batch (``micro``: one copy of the gradients kept); one rank without has no small batch, so no estimate.
"""

from __future__ import annotations

import math

import torch

FIELDS = ("noise_scale", "noise_g2", "noise_trace")
"""metrics.jsonl's names: B_simple, the |G|^2 average and the tr(Sigma) average."""


def estimates(small_sq, big_sq, b_small: float, b_big: float):
    """(|G|^2, tr(Sigma)) from the mean squared norm of gradients over b_small examples and the squared norm of
    one over b_big examples, unbiased (E|g_B|^2 = |G|^2 + tr(Sigma)/B); tensors or floats."""
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


def sizes(world_size: int, per_rank_batch: int, accumulation: int = 1) -> tuple[int, int] | None:
    """(B_small, B_big) of a step: the rank's whole batch and the global one; on one rank with accumulation the
    micro-batch and the rank's batch; None on one rank without: its only gradient is the big batch's."""
    if world_size >= 2:
        return per_rank_batch, per_rank_batch * world_size
    if accumulation >= 2:
        return per_rank_batch // accumulation, per_rank_batch
    return None


class NoiseScale:
    """The moving averages on the device and the step's two calls (measure, update); see the module docstring."""

    def __init__(self, device: torch.device, world_size: int, average_epochs: float):
        self.world_size = world_size
        self.average_epochs = average_epochs
        self.tau = 0.0
        """The averages' time constant in examples (set_epoch: average_epochs x the train split)."""
        self.state = torch.zeros(3, dtype=torch.float32, device=device)
        """[weighted sum of |G|^2, weighted sum of tr(Sigma), sum of weights]: the bias-corrected averages are
        the first two over the third (zero weight: nothing measured yet)."""
        self._before: list[torch.Tensor] = []
        self._micro_sq: torch.Tensor | None = None
        """One rank with accumulation: the mean over the step's micro-batches of their gradients' |g_j|^2."""

    def set_epoch(self, examples: int) -> None:
        """The train split's size, from which the time constant follows."""
        self.tau = self.average_epochs * examples

    def micro(self, dp, i: int, accumulation: int) -> None:
        """After micro-batch i's backward, on one rank with accumulation only (the small batch is then the
        micro-batch): |g_i|^2 from the buckets' difference to before it (each micro-batch adds g_i/accumulation;
        one copy of the gradients is kept). Device work only."""
        if self.world_size >= 2 or accumulation < 2:
            return
        parts = dp.gradient_parts()
        if i == 0:
            self._micro_sq = sum_sq(parts)
        else:
            assert self._micro_sq is not None
            self._micro_sq = self._micro_sq + sum_sq([p - b for p, b in zip(parts, self._before, strict=True)])
        if i == accumulation - 1:  # sum_j |g_j / k|^2 -> mean_j |g_j|^2
            self._micro_sq = self._micro_sq * accumulation
        elif len(self._before) != len(parts):
            self._before = [p.clone() for p in parts]
        else:
            for b, p in zip(self._before, parts, strict=True):
                b.copy_(p)

    def measure(self, dp, scale: torch.Tensor | None) -> torch.Tensor:
        """[s, q] of this step after dp.finish(): the mean over ranks of the ranks' squared gradient norms
        (the exchanged stats slot, from which the buckets divided dp.stats_scale^2 out) and the exchanged
        gradient's, divided by scale^2 (the loss scale that made it, before the scaler updates it in place);
        a float32 tensor on the device."""
        q = sum_sq(dp.gradient_parts())
        s = dp.stats.reshape(()).float() if dp.stats is not None else self._micro_sq
        if s is None:  # no small batch (one rank without accumulation, or no stats slot): the averages hold
            s = torch.full_like(q, math.nan)
        elif dp.stats is None and scale is not None:  # the micro-batches' norms, taken here, still scaled
            s = s / scale.float().square().reshape(())
        if scale is not None:
            q = q / scale.float().square().reshape(())
        return torch.stack([s, q])

    def update(self, v: torch.Tensor, found: torch.Tensor, per_rank_batch: int, accumulation: int = 1) -> None:
        """Fold this step's [s, q] into the averages unless found (non-finite gradients) or an estimate is not
        finite; per_rank_batch is the rank's whole batch (micro-batch x accumulation)."""
        b = sizes(self.world_size, per_rank_batch, accumulation)
        if b is None or not self.tau > 0:
            return
        g2, trace = estimates(v[0], v[1], *b)
        new = torch.stack([g2, trace, torch.ones_like(g2)])
        keep = math.exp(-b[1] / self.tau)
        ok = torch.isfinite(new).all() & (found <= 0)
        self.state.copy_(torch.where(ok, self.state * keep + new * (1.0 - keep), self.state))

    def b_simple(self) -> torch.Tensor:
        """The averaged B_simple as a 0-dim device tensor (NaN until |G|^2's average is positive); the same bits
        on every rank, so a rule that reads it at an epoch boundary decides alike everywhere."""
        g2, trace = self.state[0], self.state[1]
        return torch.where(g2 > 0, trace / g2, torch.full_like(g2, math.nan))

    def read(self) -> dict:
        """{noise_scale, noise_g2, noise_trace} on the host (one read; logging intervals and stage changes
        only); {} before the first estimate, noise_scale None while |G|^2's average is not positive."""
        g2w, trw, w = self.state.tolist()
        if not w > 0:
            return {}
        g2, trace = g2w / w, trw / w
        return {"noise_scale": trace / g2 if g2 > 0 else None, "noise_g2": g2, "noise_trace": trace}


def sum_sq(parts: list[torch.Tensor]) -> torch.Tensor:
    """The squared norm of the tensors together, in float32, summed in their order (the same bits everywhere)."""
    q = torch.dot(parts[0], parts[0]).float()
    for g in parts[1:]:
        q = q + torch.dot(g, g).float()
    return q


def build_noise(spec, device: torch.device, world_size: int, accumulations: list[int]) -> NoiseScale | None:
    """The estimator of a run, or None where noise.enabled is off or no stage has a small batch (one rank
    without accumulation in every stage); accumulations: each stage's."""
    if no_estimate(spec, world_size, accumulations) or not spec.noise.enabled:
        return None
    return NoiseScale(device, world_size, spec.noise.average_epochs)


def no_estimate(spec, world_size: int, accumulations: list[int]) -> str:
    """The line a run with the estimate on but nothing to estimate from says once; "" otherwise."""
    if spec.noise.enabled and not any(sizes(world_size, 2 * k, k) for k in accumulations):
        return (
            "noise scale: one rank without accumulation has no small batch to set against the big one, so no estimate"
        )
    return ""
