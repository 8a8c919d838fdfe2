"""The one sharding rule of every loader (numpy; no torch import).

An epoch's order is one permutation of the whole split, drawn from (seed, epoch) by numpy's PCG64, the same
on every rank and every machine (training; validation keeps the index order). A packed set draws it in shard
units with an in-buffer shuffle instead (data/packed.py epoch_order); the cut below is the same. The order is padded by
wrapping around to a multiple of ``world_size * batch_size`` and cut into ``world_size`` contiguous equal
shards; rank r (the GLOBAL rank) takes shard r. So every rank takes the same number of steps, and over one
epoch every sample is read exactly once across the ranks except the ``pad`` wrapped-around samples at the end
of the last shards. A rank draws the permutation (O(n) in numpy, about 20 ms at 1.28M) and keeps only its
slice: nothing is computed per other rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torus_train.job.schedule import steps_per_epoch


@dataclass(frozen=True)
class Shard:
    """The sample indices one rank reads in one epoch."""

    indices: np.ndarray
    """Indices into the split's file list, in reading order; a multiple of the batch size long."""
    pad: int
    """How many of the trailing indices are wrap-around padding (repeats of samples read elsewhere)."""
    steps: int
    """Batches per epoch (the same on every rank)."""


def epoch_order(n: int, epoch: int, seed: int) -> np.ndarray:
    """The training order of all ``n`` samples in ``epoch``: a permutation seeded by (seed, epoch)."""
    return np.random.Generator(np.random.PCG64([seed, epoch])).permutation(n)


def shard(
    n: int,
    rank: int,
    world_size: int,
    batch_size: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    order=None,
) -> Shard:
    """Rank ``rank``'s share of an epoch over ``n`` samples (see the module docstring). ``order``: the epoch's
    order when the data set draws its own (a packed set's shard-unit order, data/packed.py), else
    epoch_order's permutation (shuffle) or the index order."""
    if n < 1:
        raise ValueError("empty data set")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    steps = steps_per_epoch(n, world_size * batch_size)
    per_rank = steps * batch_size
    lo = rank * per_rank
    positions = np.arange(lo, lo + per_rank, dtype=np.int64) % n  # wrap-around padding past n
    if order is None and shuffle:
        order = epoch_order(n, epoch, seed)
    indices = order[positions] if order is not None else positions
    pad = max(0, min(per_rank, lo + per_rank - n))
    return Shard(indices, pad, steps)
