"""Virtual-rank execution of the 2D-torus all-reduce: exact sums at full scale, step counts, chunk layout."""

from __future__ import annotations

import time

import numpy as np
import pytest

from torus_train.comm.chunks import chunk_bounds
from torus_train.plan.simulate import (
    SimStats,
    check,
    flat_ring_allreduce,
    ring_all_gather,
    ring_reduce_scatter,
    torus_allreduce,
)

# 2179 is a prime larger than every grid below (2176 ranks); 1 and 7 leave most chunks empty.
RAGGED = (1, 7, 97, 2179)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("x,y", [(32, 68), (32, 34), (48, 72)])
def test_full_scale_torus_gives_every_rank_the_exact_sum(x, y):
    t0 = time.perf_counter()
    for n in RAGGED:
        r = check(x, y, n, seed=n)
        assert r.ranks == x * y
        assert r.wrong_ranks == 0, f"{x}x{y} n={n}: {r.wrong_ranks} ranks hold a wrong sum"
        assert r.steps == 2 * (x - 1) + 2 * (y - 1)
    assert time.perf_counter() - t0 < 30


@pytest.mark.timeout(60)
def test_step_counts_of_the_paper():
    assert check(32, 68, 97).steps == 196
    flat = check(2176, 1, 97, algo="flat")
    assert flat.steps == 4350 and flat.wrong_ranks == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("x,y", [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2), (2, 3), (4, 4), (5, 3)])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 13, 31])
def test_small_grids_and_sizes_smaller_than_the_grid(x, y, n):
    r = check(x, y, n, seed=x * 100 + y * 10 + n)
    assert r.ok, r


def test_bytes_sent_per_rank_match_the_bandwidth_term():
    # Each rank sends 2(X-1)/X * n along its row and 2(Y-1)/(XY) * n along its column, up to ragged rounding.
    x, y, n = 32, 68, 2179
    values = np.ones((x * y, n), dtype=np.int64)
    _, st = torus_allreduce(values, x, y)
    ideal = 2 * (x - 1) / x * n + 2 * (y - 1) / (x * y) * n
    assert ideal <= st.sent_elements.max() <= ideal + 2 * (x - 1) + 2 * (y - 1)
    assert st.phase_steps == {
        "row reduce-scatter": 31,
        "column reduce-scatter": 67,
        "column all-gather": 67,
        "row all-gather": 31,
    }
    assert st.messages == 196 * x * y


def test_reduce_scatter_leaves_chunk_p_summed_on_ring_position_p():
    rng = np.random.default_rng(3)
    p, n = 5, 23
    buf = rng.integers(-50, 50, size=(3, p, n), dtype=np.int64)
    ring_sums = buf.sum(axis=1)
    work = buf.copy()
    ring_reduce_scatter(work, SimStats(), np.zeros((3, p), dtype=np.int64), "rs")
    for pos, (lo, hi) in enumerate(chunk_bounds(n, p)):
        np.testing.assert_array_equal(work[:, pos, lo:hi], ring_sums[:, lo:hi])
    ring_all_gather(work, SimStats(), np.zeros((3, p), dtype=np.int64), "ag")
    np.testing.assert_array_equal(work, np.broadcast_to(ring_sums[:, None, :], work.shape))


def test_a_missing_step_is_caught():
    # The check has teeth: a reduce-scatter one step short leaves wrong sums on ranks.
    rng = np.random.default_rng(0)
    buf = rng.integers(1, 9, size=(1, 6, 17), dtype=np.int64)
    want = buf.sum(axis=1)
    st = SimStats()
    sent = np.zeros((1, 6), dtype=np.int64)
    from torus_train.plan import simulate

    bounds = chunk_bounds(17, 6)
    for s in range(4):  # 4 of the 5 steps
        simulate._ring_step(buf, bounds, (np.arange(6) - s - 1) % 6, True, sent)
    ring_all_gather(buf, st, sent, "ag")
    assert (buf[0] != want).any(axis=1).sum() > 0


def test_flat_ring_matches_torus_result():
    rng = np.random.default_rng(7)
    values = rng.integers(-1000, 1000, size=(12, 29), dtype=np.int64)
    a, sa = flat_ring_allreduce(values)
    b, sb = torus_allreduce(values, 4, 3)
    np.testing.assert_array_equal(a, b)
    assert (sa.steps, sb.steps) == (22, 10)


def test_bad_shape_is_rejected():
    with pytest.raises(ValueError):
        torus_allreduce(np.zeros((5, 3), dtype=np.int64), 2, 2)
