"""The 2D-torus all-reduce's exact data movement on virtual ranks, in one process (pure numpy, no torch).

Every rank's buffer is a row of one int64 array ``buf[row, col, :]``; a ring step gathers every message of the
step first (what each rank sends, as it stood before the step) and then applies them, so the result is what
real ranks exchanging messages at once would hold. Tensors are cut exactly as the real collectives cut them,
with torus_train.comm.chunks.chunk_bounds:

1. reduce-scatter along each row as a ring: X-1 steps; at step s rank (r, c) sends chunk (c-s-1) mod X to
   (r, c+1), which adds it into its own copy; afterwards (r, c) holds the row's sum of chunk c.
2. all-reduce of chunk c along column c as a ring: chunk c is cut into Y sub-chunks (chunk_bounds again);
   reduce-scatter (Y-1 steps) then all-gather (Y-1 steps).
3. all-gather along each row as a ring: X-1 steps; at step s rank (r, c) sends chunk (c-s) mod X to (r, c+1).

Sequential steps: 2(X-1) + 2(Y-1) (196 at 32x68); one flat ring over N ranks is the same ring code with
one row of N (2(N-1) steps: 4,350 at 2,176). Integers make "every rank holds the exact sum" an equality.
Work is vectorised over all rings of a phase, and over all senders of a step whose chunks have one length
(chunk lengths differ by at most one element, so there are at most two groups), so a full-scale grid runs in
one process within a test's time (timings in docs/plan.md). ``simulate_grid`` is `plan --simulate`: the check at
ragged sizes on the planned grid.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from torus_train.comm.chunks import chunk_bounds
from torus_train.errors import RunFailed
from torus_train.job.algorithms import ALGORITHMS, DEFAULT, simulated
from torus_train.registry import load

MAX_SIMULATED_RANKS = 65_536
"""`plan --simulate` holds every virtual rank's tensor in this process; beyond this it takes minutes and
gigabytes."""


@dataclass
class SimStats:
    """What a simulated all-reduce executed."""

    steps: int = 0
    """Sequential communication steps (ring steps)."""
    messages: int = 0
    """Point-to-point messages sent (empty chunks included: a real ring still sends them)."""
    phase_steps: dict = field(default_factory=dict)
    """Steps per phase name."""
    sent_elements: np.ndarray | None = None
    """Elements each rank sent, shape [ranks] (global rank order)."""


def _ring_step(
    buf: np.ndarray, bounds: Sequence[tuple[int, int]], send_chunk: np.ndarray, reduce: bool, sent: np.ndarray
) -> int:
    """One step of a batch of rings. buf: [B, P, n] (B independent rings of P ranks, ring order along axis 1).

    Ring position p sends chunk send_chunk[p] to position (p+1) % P, which adds (reduce) or copies it into the
    same chunk of its buffer. sent: [B, P] elements-sent counters. Returns the number of messages.
    """
    b, p, _ = buf.shape
    starts = np.array([lo for lo, _ in bounds])
    lengths = np.array([hi - lo for lo, hi in bounds])
    pos = np.arange(p)
    msgs = []
    for length in np.unique(lengths[send_chunk]):
        senders = pos[lengths[send_chunk] == length]
        idx = starts[send_chunk[senders]][:, None] + np.arange(length)[None, :]  # [m, L]
        data = buf[:, senders[:, None], idx]  # copy: [B, m, L]
        msgs.append(((senders + 1) % p, idx, data))
        sent[:, senders] += length
    for receivers, idx, data in msgs:  # every message was read before any is applied
        if reduce:
            buf[:, receivers[:, None], idx] += data
        else:
            buf[:, receivers[:, None], idx] = data
    return b * p


def ring_reduce_scatter(buf: np.ndarray, stats: SimStats, sent: np.ndarray, name: str) -> None:
    """Ring reduce-scatter on a batch of rings [B, P, n]: position p ends with the ring's sum of chunk p."""
    p, n = buf.shape[1], buf.shape[2]
    bounds = chunk_bounds(n, p)
    for s in range(p - 1):
        stats.messages += _ring_step(buf, bounds, (np.arange(p) - s - 1) % p, True, sent)
        stats.steps += 1
        stats.phase_steps[name] = stats.phase_steps.get(name, 0) + 1


def ring_all_gather(buf: np.ndarray, stats: SimStats, sent: np.ndarray, name: str) -> None:
    """Ring all-gather on a batch of rings [B, P, n], position p starting with chunk p complete."""
    p, n = buf.shape[1], buf.shape[2]
    bounds = chunk_bounds(n, p)
    for s in range(p - 1):
        stats.messages += _ring_step(buf, bounds, (np.arange(p) - s) % p, False, sent)
        stats.steps += 1
        stats.phase_steps[name] = stats.phase_steps.get(name, 0) + 1


def torus_allreduce(values: np.ndarray, x: int, y: int) -> tuple[np.ndarray, SimStats]:
    """Run the 2D-torus all-reduce on virtual ranks.

    values: [X*Y, n] integer array, row r of it = rank r's tensor (rank r sits at row r // X, column r % X).
    Returns (result [X*Y, n], stats); with exact integers every result row should equal values.sum(0).
    """
    values = np.asarray(values)
    if values.ndim != 2 or values.shape[0] != x * y:
        raise ValueError(f"values must have shape [{x * y}, n] for grid {x}x{y}, got {values.shape}")
    n = values.shape[1]
    buf = values.reshape(y, x, n).copy()  # buf[row, col, :] = that rank's buffer
    sent = np.zeros((y, x), dtype=np.int64)
    stats = SimStats()

    # Phase 1: reduce-scatter in each row (the Y rows are the batch of rings).
    ring_reduce_scatter(buf, stats, sent, "row reduce-scatter")

    # Phase 2: all-reduce chunk c along column c. Columns whose chunk has the same length share sub-chunk
    # bounds, so they run as one batch of rings: gather [Y, m, L] -> rings [m, Y, L] -> run -> scatter back.
    col_bounds = chunk_bounds(n, x)
    lengths = np.array([hi - lo for lo, hi in col_bounds])
    groups = [np.flatnonzero(lengths == length) for length in np.unique(lengths)]
    col_stats = []
    for cols in groups:
        length = lengths[cols[0]]
        idx = np.array([col_bounds[c][0] for c in cols])[:, None] + np.arange(length)[None, :]
        rings = buf[:, cols[:, None], idx].transpose(1, 0, 2).copy()  # [m, Y, L]
        ring_sent = np.zeros((len(cols), y), dtype=np.int64)
        st = SimStats()
        ring_reduce_scatter(rings, st, ring_sent, "column reduce-scatter")
        ring_all_gather(rings, st, ring_sent, "column all-gather")
        buf[:, cols[:, None], idx] = rings.transpose(1, 0, 2)
        sent[:, cols] += ring_sent.T
        col_stats.append(st)
    # The column groups run at the same time on the real machine: count their steps once.
    stats.steps += max(st.steps for st in col_stats)
    for st in col_stats:
        stats.messages += st.messages
    for name in ("column reduce-scatter", "column all-gather"):
        stats.phase_steps[name] = max(st.phase_steps.get(name, 0) for st in col_stats)

    # Phase 3: all-gather in each row.
    ring_all_gather(buf, stats, sent, "row all-gather")
    stats.sent_elements = sent.reshape(-1)
    return buf.reshape(x * y, n), stats


def flat_ring_allreduce(values: np.ndarray) -> tuple[np.ndarray, SimStats]:
    """One ring over all N ranks (reduce-scatter + all-gather): the baseline, 2(N-1) steps."""
    values = np.asarray(values)
    n_ranks, n = values.shape
    buf = values.reshape(1, n_ranks, n).copy()
    sent = np.zeros((1, n_ranks), dtype=np.int64)
    stats = SimStats()
    ring_reduce_scatter(buf, stats, sent, "ring reduce-scatter")
    ring_all_gather(buf, stats, sent, "ring all-gather")
    stats.sent_elements = sent.reshape(-1)
    return buf.reshape(n_ranks, n), stats


@dataclass
class CheckResult:
    """Outcome of one virtual-rank check."""

    grid: str
    """XxY, or N for the flat ring."""
    ranks: int
    """Virtual ranks."""
    elements: int
    """Elements per rank's tensor."""
    steps: int
    """Sequential steps executed."""
    expected_steps: int
    """2(X-1) + 2(Y-1) for the torus, 2(N-1) for the flat ring."""
    max_sent_elements: int
    """Most elements one rank sent."""
    wrong_ranks: int
    """Ranks whose result differs from the exact sum."""
    seconds: float
    """Wall time of the simulation."""

    @property
    def ok(self) -> bool:
        return self.wrong_ranks == 0 and self.steps == self.expected_steps


def simulate_torus(values: np.ndarray, x: int, y: int) -> tuple[np.ndarray, SimStats, int, str]:
    """The torus on grid x by y: (result, stats, the steps it must take: 2(X-1) + 2(Y-1), the grid's name)."""
    out, st = torus_allreduce(values, x, y)
    return out, st, 2 * (x - 1) + 2 * (y - 1), f"{x}x{y}"


def simulate_flat(values: np.ndarray, x: int, y: int) -> tuple[np.ndarray, SimStats, int, str]:
    """One ring over all X*Y ranks: (result, stats, the steps it must take: 2(N-1), the rank count)."""
    out, st = flat_ring_allreduce(values)
    return out, st, 2 * (x * y - 1), f"{x * y}"


def check(x: int, y: int, elements: int, seed: int = 0, algo: str = DEFAULT) -> CheckResult:
    """Simulate `algo` (an entry of torus_train.job.algorithms with `simulate`) on random int64 tensors and
    compare every rank with the exact sum."""
    entry = ALGORITHMS.get(algo)
    if entry.simulate is None:
        raise ValueError(f"algo must be one the simulator runs ({', '.join(simulated())}), got {algo!r}")
    rng = np.random.default_rng(seed)
    n_ranks = x * y
    values = rng.integers(-(10**6), 10**6, size=(n_ranks, elements), dtype=np.int64)
    expected = values.sum(axis=0)
    t0 = time.perf_counter()
    out, st, want_steps, name = load(entry.simulate)(values, x, y)
    seconds = time.perf_counter() - t0
    wrong = int((out != expected[None, :]).any(axis=1).sum())
    return CheckResult(
        name, n_ranks, elements, st.steps, want_steps, int(st.sent_elements.max(initial=0)), wrong, seconds
    )


def simulate_grid(x: int, y: int, echo: Callable[[str], None]) -> dict:
    """`plan --simulate`: the exact data movement on grid x by y at 1, 7, 97 and a prime above the rank count
    elements (ragged chunks at every size); echoes one line per size; RunFailed unless every rank ends with the
    exact sum."""
    results = []
    for n in (1, 7, 97, next_prime(x * y + 1)):
        r = check(x, y, n, seed=n)
        results.append(r.__dict__ | {"ok": r.ok})
        echo(
            f"# simulate {r.grid}: {r.ranks} virtual ranks, {n} int64 elements each: {r.steps} steps "
            f"(expected {r.expected_steps}), {r.wrong_ranks} ranks wrong, {r.seconds:.2f} s "
            f"-> {'exact sum on every rank' if r.ok else 'FAILED'}"
        )
    if not all(r["ok"] for r in results):
        raise RunFailed(f"virtual-rank torus on {x}x{y} did not give every rank the exact sum")
    return {"grid": f"{x}x{y}", "results": results}


def next_prime(n: int) -> int:
    """The smallest prime >= n."""

    def is_prime(k: int) -> bool:
        return k > 1 and all(k % d for d in range(2, int(k**0.5) + 1))

    while not is_prime(n):
        n += 1
    return n
