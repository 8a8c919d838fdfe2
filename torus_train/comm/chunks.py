"""How a flat tensor is cut into per-rank chunks (pure; shared by the real collectives and the simulator).

A tensor of n elements is split over p ranks into p contiguous chunks whose sizes differ by at most one
element: the first n % p chunks get one element more. Works for any n >= 0, including n < p (some chunks
are then empty) and primes.
"""

from __future__ import annotations

from functools import lru_cache


def chunk_sizes(n: int, parts: int) -> list[int]:
    """Sizes of the `parts` chunks of an n-element tensor."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@lru_cache(maxsize=256)  # called per piece of every all-reduce: the same few (n, parts) recur
def chunk_bounds(n: int, parts: int) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each chunk, in order."""
    out, start = [], 0
    for size in chunk_sizes(n, parts):
        out.append((start, start + size))
        start += size
    return tuple(out)
