"""The grid on MPI communicators through mpi4py, for CPU tensors (backend `mpi`).

Rows and columns come from Comm.Split (color = row or column index, key = position in the ring). Columns use
MPI_Allreduce on the column communicator. Rows exchange chunks point to point (the direct pairwise
reduce-scatter and all-gather: each member sends every other member the chunk it owns and receives its own
chunk from all of them at once), because OpenMPI's own Reduce_scatter and Allgatherv were measured here at 0.36
to 0.49 times its Allreduce for the whole torus, while its point-to-point path inside a node moves a large
message with a single copy (cross-memory attach, smsc/cma), no slower than a hand-made shared-memory segment
and without the barriers one needs. Half types travel as 16-bit words; sums of half types accumulate in
float32 and round once, in the row (torus_train.comm.arith) and in the column (a user-defined MPI operation:
MPI has no standard float16/bfloat16 sum).
"""
from __future__ import annotations

import numpy as np
import torch

from torus_train.comm.arith import accumulate, as_numpy
from torus_train.topology import Grid

_HALF = (torch.float16, torch.bfloat16)
_OPS: dict = {}
_TAG_RS, _TAG_AG = 11, 12
_CACHED_VIEWS = 8


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
        self.wire = wire      # what MPI moves: 16-bit types as raw words (mpi4py knows no float16 datatype)
        self.dtype = dtype
        self.op = op
        self.plans: dict = {}  # slices and exchange plans, made once per buffer (see MpiGrid.buffer)

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


class MpiGrid:
    """This rank's view of the grid on MPI: row and column communicators."""

    shm_row = None  # rows never use the shared-memory segment on MPI (see the module's docstring)

    def __init__(self, grid: Grid, comm=None):
        MPI = _MPI()
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        if self.comm.Get_size() != grid.size:
            from torus_train.errors import UserError
            raise UserError(f"grid {grid.x}x{grid.y} = {grid.size} ranks but mpirun started "
                            f"{self.comm.Get_size()}; use -np {grid.size} or another --grid")
        self.grid = grid
        self.rank = self.comm.Get_rank()
        self.row, self.col = grid.position(self.rank)
        self.backend = "mpi"
        self.row_comm = self.comm.Split(color=self.row, key=self.col)
        self.col_comm = self.comm.Split(color=self.col, key=self.row)
        self._IN_PLACE = MPI.IN_PLACE
        self._views: dict = {}  # (data_ptr, numel, dtype) -> _Buf, see buffer()
        self.notes: list[str] = ["rows: MPI point-to-point (pairwise exchange); columns: MPI_Allreduce"]

    @property
    def world_size(self) -> int:
        return self.grid.size

    # --- the transport interface used by torus_train.comm.algos -----------------------------------
    def buffer(self, tensor: torch.Tensor) -> _Buf:
        """What the methods below take: numpy views of the tensor, flattened (slice them, never the tensor).

        The views of the last few tensors are kept and reused while storage, length and dtype stay the same
        (the cached views hold the storage, so no other tensor can take its address meanwhile)."""
        key = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        buf = self._views.get(key)
        if buf is not None:
            return buf
        if not tensor.is_contiguous():
            raise ValueError("allreduce needs a contiguous tensor")
        buf = _Buf.of(tensor.view(-1))
        if len(self._views) >= _CACHED_VIEWS:
            self._views.pop(next(iter(self._views)))  # the oldest
        self._views[key] = buf
        return buf

    def world_allreduce(self, buf: _Buf) -> None:
        self.comm.Allreduce(self._IN_PLACE, buf.wire, op=buf.op)

    def world_max(self, buf: _Buf) -> None:
        self.comm.Allreduce(self._IN_PLACE, buf.values, op=_MPI().MAX)

    def col_allreduce(self, buf: _Buf) -> None:
        if self.grid.y > 1:
            self.col_comm.Allreduce(self._IN_PLACE, buf.wire, op=buf.op)

    def row_reduce_scatter(self, buf: _Buf, bounds) -> None:
        """Chunk `col` of the row's sum lands in flat[bounds[col]]; the other chunks are left as they were."""
        plan = buf.plans.get("rs")
        if plan is None:
            plan = buf.plans["rs"] = self._reduce_scatter_plan(buf, bounds)
        sends, recvs, mine, summands = plan
        rc = self.row_comm
        if len(sends) == 1:  # a 2-rank row: one paired exchange
            rc.Sendrecv(sends[0][1], sends[0][0], _TAG_RS, recvs[0][1], recvs[0][0], _TAG_RS)
        else:
            reqs = [rc.Irecv(w, src, _TAG_RS) for src, w in recvs]
            reqs += [rc.Isend(w, dst, _TAG_RS) for dst, w in sends]
            _MPI().Request.Waitall(reqs)
        if mine.shape[0]:  # add in a fixed order, so the sum does not depend on which message arrived first
            accumulate(mine, summands, buf.dtype)

    def _reduce_scatter_plan(self, buf: _Buf, bounds):
        """(sends [(dst, words)], receives [(src, words)], my chunk, the received chunks) of this buffer."""
        me, x = self.col, self.grid.x
        a, b = bounds[me]
        n = b - a
        work = np.empty((x - 1) * n, dtype=buf.values.dtype)  # held by the plan, so by the cached buffer
        summands = [work[i * n:(i + 1) * n] for i in range(x - 1)]  # [k - 1]: from member (me - k) % x
        recvs = [((me - k) % x, _words(summands[k - 1])) for k in range(1, x)]
        sends = [((me + k) % x, buf.wire[bounds[(me + k) % x][0]:bounds[(me + k) % x][1]]) for k in range(1, x)]
        return sends, recvs, buf.values[a:b], summands

    def row_all_gather(self, buf: _Buf, bounds) -> None:
        """Every member holds chunk `col` in flat[bounds[col]]; afterwards all hold every chunk."""
        plan = buf.plans.get("ag")
        if plan is None:
            me, x, w = self.col, self.grid.x, buf.wire
            a, b = bounds[me]
            peers = [(me + k) % x for k in range(1, x)]
            plan = buf.plans["ag"] = ([(q, w[a:b]) for q in peers], [(q, w[bounds[q][0]:bounds[q][1]]) for q in peers])
        sends, recvs = plan
        rc = self.row_comm
        if len(sends) == 1:
            rc.Sendrecv(sends[0][1], sends[0][0], _TAG_AG, recvs[0][1], recvs[0][0], _TAG_AG)
            return
        reqs = [rc.Irecv(w, src, _TAG_AG) for src, w in recvs]
        reqs += [rc.Isend(w, dst, _TAG_AG) for dst, w in sends]
        _MPI().Request.Waitall(reqs)

    def row_reduce_to_leader(self, buf: _Buf) -> None:
        if self.col == 0:
            self.row_comm.Reduce(self._IN_PLACE, buf.wire, op=buf.op, root=0)
        else:
            self.row_comm.Reduce(buf.wire, None, op=buf.op, root=0)

    def row_broadcast_from_leader(self, buf: _Buf) -> None:
        self.row_comm.Bcast(buf.wire, root=0)

    def close(self) -> None:
        self._views = {}
