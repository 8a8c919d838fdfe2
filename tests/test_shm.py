"""Shared-memory rows: the exchange itself, and a peer that dies or hangs is named instead of hanging."""

import functools
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch

from torus_train.comm.chunks import chunk_bounds
from torus_train.comm.shm import ShmRow
from torus_train.errors import PeerLost


def _pair(timeout=5.0):
    name = f"torus-train-test-{uuid.uuid4().hex[:8]}"
    a = ShmRow(name, 0, [10, 11], capacity=4096, timeout=timeout)
    b = ShmRow(name, 1, [10, 11], capacity=4096, timeout=timeout)
    a.connect()
    b.connect()
    a.unlink()
    b.unlink()
    return a, b


def _both(fa, fb):
    t = threading.Thread(target=fb)
    t.start()
    fa()
    t.join(10)
    assert not t.is_alive()


def _pieces(row: ShmRow, t: torch.Tensor, out: dict[str, torch.Tensor], key: str) -> None:
    for piece in row.pieces(t):  # a 4096-byte slot holds 1024 float32: 2500 crosses in three pieces
        bounds = chunk_bounds(len(piece), row.size)
        row.reduce_scatter(piece, bounds)
        row.all_gather(piece, bounds)
    out[key] = t


def test_two_members_reduce_scatter_and_all_gather_in_pieces():
    a, b = _pair()
    for n in (1, 5, 1024, 1023, 2500):
        x = torch.arange(n, dtype=torch.float32)
        y = torch.full((n,), 100.0)
        out: dict[str, torch.Tensor] = {}
        _both(functools.partial(_pieces, a, x, out, "a"), functools.partial(_pieces, b, y, out, "b"))
        expect = torch.arange(n, dtype=torch.float32) + 100
        assert torch.equal(out["a"], expect) and torch.equal(out["b"], expect)
    a.close()
    b.close()


def test_a_dead_peer_is_named():
    name = f"torus-train-test-{uuid.uuid4().hex[:8]}"
    row = ShmRow(name, 0, [4, 6], capacity=4096, timeout=30)
    # rank 6 attaches from another process, then exits without ever reaching the barrier
    code = f"from torus_train.comm.shm import ShmRow;r = ShmRow({name!r}, 1, [4, 6], capacity=4096, timeout=30)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    row.connect()
    t = time.monotonic()
    with pytest.raises(PeerLost, match=r"rank 6 \(pid \d+\) exited during the reduce of row \[4, 6\]"):
        row.barrier("reduce")
    assert time.monotonic() - t < 5
    row.unlink()
    row.close()


def test_a_hung_peer_times_out_naming_it():
    a, b = _pair(timeout=1.5)
    t = time.monotonic()
    with pytest.raises(
        PeerLost, match=r"rank 10: all-gather of row \[10, 11\] timed out after 1.5 s waiting for rank 11"
    ):
        a.barrier("all-gather")
    assert time.monotonic() - t < 5
    a.close()
    b.close()


def _pipelined(row: ShmRow, pieces: list[torch.Tensor], delay: float) -> None:
    """The pipelined exchange's row order (comm/pipeline.py): reduce-scatter of piece u+1 before the all-gather
    of piece u, so two pieces are in flight; ``delay`` makes this member slow between the two."""
    bounds = [chunk_bounds(len(p), row.size) for p in pieces]
    for u, piece in enumerate(pieces):
        row.reduce_scatter(piece, bounds[u])
        if u:
            time.sleep(delay)
            row.all_gather(pieces[u - 1], bounds[u - 1])
    row.all_gather(pieces[-1], bounds[-1])


def test_two_pieces_in_flight_in_the_pipelined_order():
    """Three members, one slow: every piece's sum is exact, though a fast member writes the next pieces while
    the slow one still reads (the three slot sets of shm.py's docstring)."""
    name = f"torus-train-test-{uuid.uuid4().hex[:8]}"
    rows = [ShmRow(name, i, [0, 1, 2], capacity=4096, timeout=10) for i in range(3)]
    for r in rows:
        r.connect()
    rows[0].unlink()
    sizes = (1024, 7, 1000, 1, 999, 1024, 3)
    mine = [[torch.full((n,), float(10**i)) + torch.arange(n) for n in sizes] for i in range(3)]
    threads = [
        threading.Thread(target=_pipelined, args=(r, m, 0.002 if r.index == 1 else 0.0))
        for r, m in zip(rows[1:], mine[1:], strict=True)
    ]
    for t in threads:
        t.start()
    _pipelined(rows[0], mine[0], 0.0)
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    for i, n in enumerate(sizes):
        expect = 111.0 + 3 * torch.arange(n, dtype=torch.float32)
        assert all(torch.equal(mine[m][i], expect) for m in range(3)), i
    for r in rows:
        r.close()
