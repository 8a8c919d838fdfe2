"""The grid on MPI communicators through mpi4py, for CPU tensors (backend `mpi`).

Rows and columns come from Comm.Split (color = row or column index, key = position in the ring). Columns use
MPI_Allreduce on the column communicator. Rows exchange chunks point to point (the direct pairwise
reduce-scatter and all-gather: each member sends every other member the chunk it owns and receives its own
chunk from all of them at once), because a torus on OpenMPI's own Reduce_scatter and Allgatherv runs well
below its Allreduce, while its point-to-point path inside a node moves a large message with a single copy
(cross-memory attach, smsc/cma), no slower than a hand-made shared-memory segment and without the barriers
one needs (figures in docs/comm.md). Half types travel as 16-bit words; sums of half types accumulate in
float32 and round once, in the row (torus_train.comm.arith) and in the column (a user-defined MPI operation:
MPI has no standard float16/bfloat16 sum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from torus_train.comm.arith import accumulate, as_numpy
from torus_train.errors import UserError
from torus_train.job.topology import Grid

_HALF = (torch.float16, torch.bfloat16)
_OPS: dict = {}
_TAG_RS, _TAG_AG = 11, 12
_CACHED_VIEWS = 8
# The step kinds (the C replay in scripts/experiments/mpi_native.c numbers its ops the same way)
SENDRECV, ISEND, IRECV, WAITALL, ALLREDUCE, REDUCE, BCAST, ADD = range(8)


def _MPI():
    from mpi4py import MPI

    return MPI  # (a module-level import would make importing this module start MPI)


def _half_sum_op(dtype: torch.dtype):
    """MPI.Op summing 16-bit words that hold `dtype` values."""
    if dtype not in _OPS:
        MPI = _MPI()

        def fn(inbuf, inoutbuf, datatype, _dt=dtype):
            if memoryview(inbuf).nbytes == 0:
                return
            a = torch.frombuffer(inbuf, dtype=_dt)
            b = torch.frombuffer(inoutbuf, dtype=_dt)
            b.copy_(a.float() + b.float())

        _OPS[dtype] = MPI.Op.Create(fn, commute=True)
    return _OPS[dtype]


class _Buf:
    """A contiguous CPU tensor as MPI sees it: numpy views (the values, and the words MPI moves) and the op.

    Slicing one costs a fraction of slicing a torch tensor and calling .numpy() again."""

    __slots__ = ("dtype", "op", "plans", "values", "wire")

    def __init__(self, values: np.ndarray, wire: np.ndarray, dtype: torch.dtype, op):
        self.values = values  # as torus_train.comm.arith.as_numpy gives it (bfloat16 as uint16 words)
        self.wire = wire  # what MPI moves: 16-bit types as raw words (mpi4py knows no float16 datatype)
        self.dtype = dtype
        self.op = op
        self.plans: dict = {}  # slices, and each algorithm's recorded steps (see MpiGrid.run)

    @classmethod
    def of(cls, t: torch.Tensor) -> _Buf:
        MPI = _MPI()
        values = as_numpy(t)
        if t.dtype in _HALF:
            return cls(values, values.view(np.uint16), t.dtype, _half_sum_op(t.dtype))
        return cls(values, values, t.dtype, MPI.SUM)

    def __getitem__(self, s: slice) -> _Buf:
        key = (s.start, s.stop)
        part = self.plans.get(key)
        if part is None:
            part = self.plans[key] = _Buf(self.values[s], self.wire[s], self.dtype, self.op)
        return part

    def __len__(self) -> int:
        return self.values.shape[0]


def _words(a: np.ndarray) -> np.ndarray:
    """`a` as MPI moves it: 16-bit types as their raw words."""
    return a.view(np.uint16) if a.itemsize == 2 else a


class _Step(NamedTuple):
    """One recorded operation: an MPI call on communicator `comm` (0 world, 1 row, 2 column) or a local add."""

    kind: int  # one of the step kinds above, or _HALF_ADD
    comm: int = 0
    a: np.ndarray | None = None  # what is sent / reduced in place / added to (None: MPI_IN_PLACE at a root)
    b: np.ndarray | None = None  # what is received / the addend
    peer: int = 0  # destination or root
    src: int = 0
    tag: int = 0
    op: object = None  # the MPI op of a reduction
    summands: tuple = ()  # _HALF_ADD: the addends, in order
    dtype: torch.dtype | None = None


_HALF_ADD = 100  # half types: add all summands in float32, round once (Python only)


class _Program:
    """A recorded algorithm, ready to replay: `calls` is [(callable, args)]; `steps` keeps its arrays alive."""

    __slots__ = ("calls", "how", "steps")

    def __init__(self, calls, steps, how: str):
        self.calls, self.steps, self.how = calls, steps, how


class MpiGrid:
    """This rank's view of the grid on MPI: row and column communicators."""

    def __init__(self, grid: Grid, comm=None):
        MPI = _MPI()
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        if self.comm.Get_size() != grid.size:
            raise UserError(
                f"grid {grid.x}x{grid.y} = {grid.size} ranks but mpirun started "
                f"{self.comm.Get_size()}; use -np {grid.size} or another --grid"
            )
        self.grid = grid
        self.rank = self.comm.Get_rank()
        self.row, self.col = grid.position(self.rank)
        self.backend = "mpi"
        self.row_comm = self.comm.Split(color=self.row, key=self.col)
        self.col_comm = self.comm.Split(color=self.col, key=self.row)
        self._comms = (self.comm, self.row_comm, self.col_comm)
        self._IN_PLACE = MPI.IN_PLACE
        self._views: dict = {}  # (data_ptr, numel, dtype) -> _Buf, see buffer()
        self._recording: list | None = None  # see run()
        self.notes: list[str] = ["rows: MPI point-to-point (pairwise exchange); columns: MPI_Allreduce"]

    # --- the transport contract (torus_train.comm.transport.Transport) ------------------------------
    def buffer(self, tensor: torch.Tensor) -> _Buf:
        """What the methods below take: numpy views of the tensor, flattened (slice them, never the tensor).

        The views of the last few tensors are kept and reused while storage, length and dtype stay the same
        (the cached views hold the storage, so no other tensor can take its address meanwhile)."""
        if not tensor.is_contiguous():  # (also on a hit: a strided view can share address, length and dtype)
            raise ValueError("allreduce needs a contiguous tensor")
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        buf = self._views.get(key)
        if buf is not None:
            return buf
        buf = _Buf.of(tensor.view(-1))
        if len(self._views) >= _CACHED_VIEWS:
            self._views.pop(next(iter(self._views)))  # the oldest
        self._views[key] = buf
        return buf

    def run(self, algorithm, buf: _Buf) -> None:
        """Run `algorithm(buf, self)`: recorded once per buffer, then replayed.

        The methods below emit steps (MPI calls and local adds); while recording they are only collected. An
        algorithm's steps depend on the buffer's length and dtype and on the grid, never on its values, so a
        buffer reduced again (a DDP bucket, the bench) replays them without rebuilding slices or plans."""
        prog = buf.plans.get(algorithm)
        if prog is None:
            self._recording = []
            try:
                algorithm(buf, self)
                steps = self._recording
            finally:
                self._recording = None
            prog = buf.plans[algorithm] = self._compile(steps)
        with np.errstate(over="ignore"):  # a sum past the dtype's range is inf, silently, as in MPI's own sum
            for call, args in prog.calls:
                call(*args)

    def replay_kind(self, algorithm, buf: _Buf) -> str | None:
        """How `algorithm` is replayed on `buf` ('python' here) once it has run, else None (for the tests)."""
        prog = buf.plans.get(algorithm)
        return prog.how if prog is not None else None

    def _emit(self, *steps: _Step) -> None:
        if self._recording is not None:
            self._recording.extend(steps)
        else:
            for call, args in self._python_calls(steps):
                call(*args)

    def _compile(self, steps: list[_Step]) -> _Program:
        return _Program(self._python_calls(steps), steps, "python")

    def _python_calls(self, steps) -> list:
        calls: list[tuple[Callable, tuple]] = []
        pending: list[tuple[Callable, tuple]] = []
        for s in steps:
            c = self._comms[s.comm]
            if s.kind == SENDRECV:
                calls.append((c.Sendrecv, (s.a, s.peer, s.tag, s.b, s.src, s.tag)))
            elif s.kind == ISEND:
                pending.append((c.Isend, (s.a, s.peer, s.tag)))
            elif s.kind == IRECV:
                pending.append((c.Irecv, (s.b, s.src, s.tag)))
            elif s.kind == WAITALL:
                calls.append((_start_and_wait, (tuple(pending),)))
                pending = []
            elif s.kind == ALLREDUCE:
                calls.append((c.Allreduce, (self._IN_PLACE, s.a, s.op)))
            elif s.kind == REDUCE:
                calls.append((c.Reduce, (self._IN_PLACE if s.a is None else s.a, s.b, s.op, s.peer)))
            elif s.kind == BCAST:
                calls.append((c.Bcast, (s.a, s.peer)))
            elif s.kind == ADD:
                calls.append((np.add, (s.a, s.b, s.a)))
            elif s.kind == _HALF_ADD:
                calls.append((accumulate, (s.a, list(s.summands), s.dtype)))
            else:
                raise ValueError(f"unknown step kind {s.kind}")
        if pending:
            raise ValueError("an exchange without its wait")
        return calls

    @staticmethod
    def pieces(buf: _Buf):
        """One piece: rows go point to point, whatever the length (no staging slots to fit)."""
        return (buf,)

    def world_allreduce(self, buf: _Buf) -> None:
        self._emit(_Step(ALLREDUCE, 0, buf.wire, op=buf.op))

    def world_max(self, buf: _Buf) -> None:
        self.comm.Allreduce(self._IN_PLACE, buf.values, op=_MPI().MAX)  # never recorded: bench bookkeeping

    def col_allreduce(self, buf: _Buf) -> None:
        if self.grid.y > 1:
            self._emit(_Step(ALLREDUCE, 2, buf.wire, op=buf.op))

    def row_reduce_scatter(self, buf: _Buf, bounds) -> None:
        """Chunk `col` of the row's sum lands in flat[bounds[col]]; the other chunks are left as they were."""
        me, x = self.col, self.grid.x
        a, b = bounds[me]
        n = b - a
        work = np.empty((x - 1) * n, dtype=buf.values.dtype)  # held by the steps, so by the cached buffer
        summands = [work[i * n : (i + 1) * n] for i in range(x - 1)]  # [k - 1]: from member (me - k) % x
        recvs = [((me - k) % x, _words(summands[k - 1])) for k in range(1, x)]
        sends = [((me + k) % x, buf.wire[bounds[(me + k) % x][0] : bounds[(me + k) % x][1]]) for k in range(1, x)]
        self._exchange(sends, recvs, _TAG_RS)
        if n:  # add in a fixed order, so the sum does not depend on which message arrived first
            mine = buf.values[a:b]
            if buf.dtype in _HALF:
                self._emit(_Step(_HALF_ADD, a=mine, summands=tuple(summands), dtype=buf.dtype))
            else:
                self._emit(*[_Step(ADD, a=mine, b=s) for s in summands])

    def row_all_gather(self, buf: _Buf, bounds) -> None:
        """Every member holds chunk `col` in flat[bounds[col]]; afterwards all hold every chunk."""
        me, x, w = self.col, self.grid.x, buf.wire
        a, b = bounds[me]
        peers = [(me + k) % x for k in range(1, x)]
        self._exchange([(q, w[a:b]) for q in peers], [(q, w[bounds[q][0] : bounds[q][1]]) for q in peers], _TAG_AG)

    def _exchange(self, sends, recvs, tag) -> None:
        """Send each (peer, words) of `sends` and receive each of `recvs` along the row, all at once."""
        if len(sends) == 1:  # a 2-rank row: one paired exchange
            (dst, out), (src, into) = sends[0], recvs[0]
            self._emit(_Step(SENDRECV, 1, out, into, peer=dst, src=src, tag=tag))
            return
        self._emit(
            *[_Step(IRECV, 1, b=w, src=src, tag=tag) for src, w in recvs],
            *[_Step(ISEND, 1, a=w, peer=dst, tag=tag) for dst, w in sends],
            _Step(WAITALL, 1),
        )

    def row_reduce_to_leader(self, buf: _Buf) -> None:
        if self.col == 0:
            self._emit(_Step(REDUCE, 1, None, buf.wire, peer=0, op=buf.op))
        else:
            self._emit(_Step(REDUCE, 1, buf.wire, None, peer=0, op=buf.op))

    def row_broadcast_from_leader(self, buf: _Buf) -> None:
        self._emit(_Step(BCAST, 1, buf.wire, peer=0))

    def close(self) -> None:
        self._views = {}


def _start_and_wait(starts) -> None:
    _MPI().Request.Waitall([start(*args) for start, args in starts])
