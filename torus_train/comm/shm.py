"""A horizontal ring inside one node, exchanged through shared memory.

Why: gloo has no shared-memory transport, and its reduce-scatter and all-gather over loopback TCP cost more
than its own all-reduce of the whole tensor, which they are meant to halve (figures in docs/comm.md). The 2D
torus exists to run the horizontal rings over the fast links inside a node (NVLink in the paper); on a CPU
node the fast link is memory, so the rows go through one shared segment per row and only the vertical rings
use the network backend.

Layout of a segment (one per row, created by the row's first rank, unlinked as soon as all members mapped it):
    header: one 64-byte line per member: [arrival counter, pid]
    SETS (3) sets of X slots of `capacity` bytes, one slot per member; piece u uses set u mod 3.
Tensors larger than a slot go through in pieces. Each member writes only into its own slot, and only what the
others need: for the reduce-scatter, the chunks the others own (not its own); for the all-gather, its reduced
chunk, into the place of its own chunk. So a member copies (X-1)/X of a piece in and out, never the whole.
Two pieces may be in flight: the pipelined exchange (torus_train.comm.pipeline) runs piece u+1's reduce-scatter
before piece u's all-gather, so a piece's closing operation takes the oldest open set (first in, first out).
Why three sets: between the last read of a set (piece u's all-gather) and its next write (piece u+3's
reduce-scatter) lie the barriers of piece u+2's reduce-scatter and piece u+1's all-gather, in either order,
and every member passes a barrier only after reading what came before; with two sets the next write would
follow piece u's all-gather directly in the pipelined order.
Every phase is bracketed by a row barrier on the counters.
A rank that arrives bumps its counter and writes one byte into each peer's wake-up FIFO; a waiting rank
checks the counters a few times, then sleeps in select() on its own FIFO, so waiting ranks give their core to
the ones still working (ranks may outnumber cores) and wake as soon as the last peer arrives. A waiting rank
notices a peer process that died, and gives up after `timeout` seconds naming the ranks that did not arrive.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import time
from collections import deque

import numpy as np
import torch

from torus_train.comm.arith import STORAGE as _STORAGE
from torus_train.comm.arith import accumulate as _accumulate
from torus_train.comm.arith import as_numpy as _np
from torus_train.errors import PeerLost, RunFailed

_LINE = 64  # bytes per header line: keeps each member's counter on its own cache line
_NO_SLOTS = np.empty((0, 0), dtype=np.int64)  # in place of a view of the mapping before there is one, or after
DEFAULT_CAPACITY = 8 << 20
SETS = 3
"""Slot sets of a row segment: enough for two pieces in flight (the module docstring says why three)."""


def shm_dir() -> str:
    return os.environ.get("TORUS_TRAIN_SHM_DIR", "/dev/shm")


class ShmRow:
    """The members of one row on one node, sharing a segment. All members construct it with the same name."""

    def __init__(
        self,
        name: str,
        index: int,
        ranks: list[int],
        capacity: int = DEFAULT_CAPACITY,
        timeout: float = 300.0,
        create: bool | None = None,
    ):
        self.index = index  # my position in the row
        self.ranks = list(ranks)  # global ranks of the row, for error messages
        self.size = len(ranks)
        self.capacity = int(capacity)
        self.timeout = float(timeout)
        self.path = os.path.join(shm_dir(), name)
        header = _LINE * self.size
        self._data_offset = header
        total = header + SETS * self.size * self.capacity
        create = (index == 0) if create is None else create
        if create:
            # Build under a temporary name and rename, so a joining member never sees a short file.
            tmp = f"{self.path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, total)
            os.rename(tmp, self.path)
        else:
            fd = self._open_existing()
            if os.fstat(fd).st_size < total:
                os.close(fd)
                raise RunFailed(
                    f"shared-memory segment {self.path} is smaller than expected; another job may use the same name"
                )
        self._mm = mmap.mmap(fd, total)
        os.close(fd)
        self._hdr: np.ndarray = np.frombuffer(self._mm, dtype=np.int64, count=header // 8).reshape(
            self.size, _LINE // 8
        )
        self._hdr[index, 1] = os.getpid()
        self._epoch = 0
        # my wake-up FIFO; peers open it in connect()
        self._wake_path = f"{self.path}.w{index}"
        if os.path.exists(self._wake_path):
            os.unlink(self._wake_path)
        os.mkfifo(self._wake_path, 0o600)
        # O_RDWR: opening a FIFO this way never blocks and never sees end-of-file
        self._wake_fd = os.open(self._wake_path, os.O_RDWR | os.O_NONBLOCK)
        self._peer_fds: list[int] = []
        self._typed: dict = {}
        self._pieces = 0  # pieces exchanged so far: selects the slot set
        self._open: deque[np.ndarray] = deque()  # slot sets of the pieces in flight, oldest first

    def connect(self) -> None:
        """Open every peer's wake-up FIFO; call once all members are constructed (after a row barrier)."""
        for i in range(self.size):
            if i != self.index:
                self._peer_fds.append(os.open(f"{self.path}.w{i}", os.O_RDWR | os.O_NONBLOCK))

    def _open_existing(self) -> int:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise RunFailed(
                        f"rank {self.ranks[self.index]}: shared-memory segment {self.path} of row "
                        f"{self.ranks} never appeared"
                    ) from None
                time.sleep(0.001)

    def unlink(self) -> None:
        """Remove the names (mappings and open FIFOs stay valid); call once every member has connected.

        Every member's FIFO name goes, not only its own: a member that died before unlinking leaves nothing."""
        paths = [f"{self.path}.w{i}" for i in range(self.size)] + ([self.path] if self.index == 0 else [])
        for p in paths:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        for fd in [*self._peer_fds, self._wake_fd]:
            try:
                os.close(fd)
            except OSError:
                pass
        self._peer_fds = []
        self._typed = {}
        self._open.clear()
        self._hdr = _NO_SLOTS  # drops the view of the mapping, which could not close under it
        try:
            self._mm.close()
        except BufferError:
            pass  # a view is still alive somewhere; the mapping goes with the process

    # --- synchronisation ---------------------------------------------------------------------
    def barrier(self, what: str = "row exchange") -> None:
        """Wait until every member of the row has arrived here."""
        self._epoch += 1
        e = self._epoch
        hdr = self._hdr
        hdr[self.index, 0] = e
        for fd in self._peer_fds:
            try:
                os.write(fd, b"\0")
            except BlockingIOError:
                pass  # the peer has a full pipe of wake-ups pending already
        counters = hdr[:, 0]
        if (counters >= e).all():
            return
        start = time.monotonic()
        next_check = start + 1.0
        spins = 0
        while not (counters >= e).all():
            spins += 1
            if spins < 8:
                os.sched_yield()
                continue
            ready, _, _ = select.select([self._wake_fd], [], [], 0.5)
            if ready:
                try:
                    os.read(self._wake_fd, 65536)
                except BlockingIOError:
                    pass
                except OSError as exc:  # pragma: no cover
                    if exc.errno != errno.EAGAIN:
                        raise
            now = time.monotonic()
            if now > next_check:
                next_check = now + 1.0
                self._check_peers(e, what, now - start)

    def _check_peers(self, e: int, what: str, waited: float) -> None:
        missing = [i for i in range(self.size) if self._hdr[i, 0] < e]
        dead = []
        for i in missing:
            pid = int(self._hdr[i, 1])
            if pid > 0:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    dead.append(i)
        me = self.ranks[self.index]
        if dead:
            names = ", ".join(f"rank {self.ranks[i]} (pid {int(self._hdr[i, 1])})" for i in dead)
            raise PeerLost(f"rank {me}: {names} exited during the {what} of row {self.ranks}")
        if waited > self.timeout:
            names = ", ".join(f"rank {self.ranks[i]}" for i in missing)
            raise PeerLost(
                f"rank {me}: {what} of row {self.ranks} timed out after {self.timeout:g} s waiting for {names}"
            )

    # --- buffers ------------------------------------------------------------------------------
    def _slots(self, dtype: torch.dtype) -> np.ndarray:
        """[X, piece] slots of the next slot set as a numpy array of `dtype`'s storage type.

        numpy slicing costs a fraction of torch's, which matters for small messages; the views are built once
        per dtype and set.
        """
        which = self._pieces % SETS
        self._pieces += 1
        key = (dtype, which)
        view = self._typed.get(key)
        if view is None:
            npt = _STORAGE[dtype]
            per = self.capacity // npt().itemsize
            span = self.size * self.capacity
            view = np.frombuffer(
                self._mm, dtype=npt, count=self.size * per, offset=self._data_offset + which * span
            ).reshape(self.size, per)
            self._typed[key] = view
        return view

    def piece_elems(self, dtype: torch.dtype) -> int:
        return self.capacity // _STORAGE[dtype]().itemsize

    # --- the row exchange of the transport contract (torus_train.comm.transport.RowExchange) ------------
    kind = "shm"

    def pieces(self, buf: torch.Tensor):
        """`buf` as views of at most one slot each, in order."""
        step = self.piece_elems(buf.dtype)
        n = len(buf)
        if n <= step:
            return (buf,)
        return (buf[s : s + step] for s in range(0, n, step))

    def reduce_scatter(self, piece: torch.Tensor, bounds) -> None:
        """Sum the row's pieces; my chunk `bounds[me]` of the sum lands in my own piece.

        The slot set stays reserved for the all_gather() of the same piece, which must follow (at most one other
        piece's reduce-scatter between them).
        """
        p = _np(piece)
        slots = self._slots(piece.dtype)
        self._open.append(slots)
        me = self.index
        mine = slots[me]
        for i, (a, b) in enumerate(bounds):  # the chunks the others reduce
            if i != me and b > a:
                mine[a:b] = p[a:b]
        self.barrier("reduce-scatter")
        a, b = bounds[me]
        if b > a:
            _accumulate(p[a:b], [slots[i, a:b] for i in range(self.size) if i != me], piece.dtype)

    def all_gather(self, piece: torch.Tensor, bounds) -> None:
        """Every member holds its chunk `bounds[me]` of the piece; afterwards all hold the whole piece."""
        p = _np(piece)
        slots = self._open.popleft()
        me = self.index
        a, b = bounds[me]
        if b > a:  # my chunk's place in my slot: nobody read it during the reduce-scatter
            slots[me, a:b] = p[a:b]
        self.barrier("all-gather")
        for i, (c, d) in enumerate(bounds):
            if i != me and d > c:
                p[c:d] = slots[i, c:d]

    def reduce_to_leader(self, piece: torch.Tensor) -> None:
        """Sum the row's pieces into the first member's piece (the row leader).

        The slot set stays reserved for the broadcast_from_leader() of the same piece, which must follow.
        """
        p = _np(piece)
        n = p.shape[0]
        slots = self._slots(piece.dtype)
        self._open.append(slots)
        if self.index != 0:
            slots[self.index, :n] = p
        self.barrier("reduce")
        if self.index == 0:
            _accumulate(p, [slots[i, :n] for i in range(1, self.size)], piece.dtype)

    def broadcast_from_leader(self, piece: torch.Tensor) -> None:
        """Copy the first member's piece to every member (through the leader's slot, unread so far)."""
        p = _np(piece)
        n = p.shape[0]
        slots = self._open.popleft()
        if self.index == 0:
            slots[0, :n] = p
        self.barrier("broadcast")
        if self.index != 0:
            p[:] = slots[0, :n]
