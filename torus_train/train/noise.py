"""The gradient noise scale B_simple = tr(Sigma)/|G|^2 (McCandlish et al. 2018, arXiv 1812.06162, App. A.1) on
every step, from two squared gradient norms taken at the same parameters, at no extra collective:

  1. small batch: each rank's squared gradient norm |g_r|^2 before the exchange (B_small = the rank's whole
     batch, micro-batch x accumulation). It rides in the gradient exchange itself, one fp32 element appended
     to the last bucket (comm/buckets.py, ``stats``), so the all-reduce that averages the gradients hands every
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
micro-batch, so Sigma is the covariance of those. One rank has no small batch: no estimate (``sizes``).
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


def sizes(world_size: int, per_rank_batch: int) -> tuple[int, int] | None:
    """(B_small, B_big) of a step; None with one rank: its only gradient is the big batch's."""
    if world_size < 2:
        return None
    return per_rank_batch, per_rank_batch * world_size


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

    def set_epoch(self, examples: int) -> None:
        """The train split's size, from which the time constant follows."""
        self.tau = self.average_epochs * examples

    def measure(self, dp, scale: torch.Tensor | None) -> torch.Tensor:
        """[s, q] of this step after dp.finish(): the mean over ranks of the ranks' squared gradient norms
        (the exchanged stats slot, from which the buckets divided dp.stats_scale^2 out) and the exchanged
        gradient's, divided by scale^2 (the loss scale that made it, before the scaler updates it in place);
        a float32 tensor on the device."""
        parts = dp.gradient_parts()
        q = torch.dot(parts[0], parts[0]).float()
        for g in parts[1:]:
            q = q + torch.dot(g, g).float()
        if scale is not None:
            q = q / scale.float().square().reshape(())
        return torch.stack([dp.stats.reshape(()).float(), q])

    def update(self, v: torch.Tensor, found: torch.Tensor, per_rank_batch: int) -> None:
        """Fold this step's [s, q] into the averages unless found (non-finite gradients) or an estimate is not
        finite; per_rank_batch is the rank's whole batch (micro-batch x accumulation)."""
        b = sizes(self.world_size, per_rank_batch)
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


def build_noise(spec, device: torch.device, world_size: int) -> NoiseScale | None:
    """The estimator of a run, or None where noise.enabled is off or there is one rank."""
    if not spec.noise.enabled or sizes(world_size, 1) is None:
        return None
    return NoiseScale(device, world_size, spec.noise.average_epochs)


def no_estimate(spec, world_size: int) -> str:
    """The line a run with the estimate on but nothing to estimate from says once; "" otherwise."""
    if spec.noise.enabled and sizes(world_size, 1) is None:
        return "noise scale: one rank has no small batch to set against the big one, so no estimate"
    return ""
