"""The bucket rule: how a model's gradients are cut into the buckets that are exchanged (pure; no torch).

One rule for the run and the plan: comm/buckets.py's BucketedModel builds its flat buckets by it (every
``comm.algo``, ddp included), and plan/timeline.py predicts the step from the same buckets.

* Order: backward produces a feed-forward model's gradients in the reverse of its parameter order, so the
  buckets are cut in that order and exchanged first to last.
* Cut: a bucket holds at most its cap (the first at most ``first_bytes``, small so that the exchange starts
  early in backward, and never more than the others; every later one at most the bucket size, ``comm.bucket_mb``);
  a tensor that would pass the cap starts the next bucket, and a tensor larger than the cap is a bucket of its
  own. Where the key (the dtype) changes a new bucket starts: one bucket is one flat tensor of one dtype.

DDP's reducer cuts differently: its bucket closes once it has reached its cap, so it holds the tensor that
passed it (ResNet-50 at 25 MiB: DDP 5 buckets, this rule 6, the first being fc.bias alone).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

FIRST_BUCKET_BYTES = 1 << 20
"""The first bucket's cap, 1 MiB (as DDP's first bucket): the exchange starts early in the backward pass."""


def assign_buckets(
    sizes: Sequence[int],
    bucket_bytes: int,
    first_bytes: int = FIRST_BUCKET_BYTES,
    keys: Sequence[Hashable] | None = None,
) -> list[list[int]]:
    """Tensors of ``sizes`` bytes, given in gradient-ready order, cut into buckets of at most ``bucket_bytes``
    (the first at most ``min(first_bytes, bucket_bytes)``) and where ``keys`` (one per tensor) changes: the
    indices into ``sizes`` per bucket, in order. A tensor larger than the cap is a bucket of its own."""
    buckets: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i, nbytes in enumerate(sizes):
        cap = min(first_bytes, bucket_bytes) if not buckets else bucket_bytes
        if cur and (size + nbytes > cap or (keys is not None and keys[i] != keys[cur[0]])):
            buckets.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += nbytes
    if cur:
        buckets.append(cur)
    return buckets


def parameter_buckets(
    sizes: Sequence[int],
    bucket_bytes: int,
    first_bytes: int = FIRST_BUCKET_BYTES,
    keys: Sequence[Hashable] | None = None,
) -> list[list[int]]:
    """The buckets of parameters given in parameter order (``module.parameters()``): the reverse order cut by
    assign_buckets; indices into ``sizes`` per bucket, each bucket in gradient-ready order."""
    last = len(sizes) - 1
    ready = [last - i for i in range(len(sizes))]
    cut = assign_buckets(
        [sizes[i] for i in ready], bucket_bytes, first_bytes, None if keys is None else [keys[i] for i in ready]
    )
    return [[ready[j] for j in b] for b in cut]
