"""The grid on MPI communicators through mpi4py, for CPU tensors (backend `mpi`).

Rows and columns come from Comm.Split (color = row or column index, key = position in the ring). Rows whose
ranks share a node exchange through the same shared-memory segment as the gloo path (torus_train.comm.shm);
columns use MPI_Allreduce on the column communicator. Half types travel as 16-bit words and are summed by a
user-defined MPI operation (MPI has no standard float16/bfloat16 sum), accumulating in float32 per pair.
"""
from __future__ import annotations

import uuid

import torch

from torus_train.comm.groups import shm_capacity
from torus_train.comm.shm import ShmRow
from torus_train.topology import Grid

_HALF = (torch.float16, torch.bfloat16)
_OPS: dict = {}


def _MPI():
    from mpi4py import MPI
    return MPI


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


def _msg(t: torch.Tensor):
    """(numpy array, MPI datatype, reduction op) for a contiguous CPU tensor."""
    MPI = _MPI()
    if t.dtype in _HALF:
        return t.view(torch.int16).numpy(), MPI.SHORT, _half_sum_op(t.dtype)
    types = {torch.float32: MPI.FLOAT, torch.float64: MPI.DOUBLE, torch.int64: MPI.INT64_T,
             torch.int32: MPI.INT32_T}
    return t.numpy(), types[t.dtype], MPI.SUM


class MpiGrid:
    """This rank's view of the grid on MPI: row and column communicators, and the shared-memory row."""

    def __init__(self, grid: Grid, comm=None, use_shm: bool | None = None, timeout: float = 300.0):
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
        self.shm_row: ShmRow | None = None
        self.notes: list[str] = []
        if use_shm is None:
            use_shm = True
        if use_shm and grid.x > 1:
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
            node_id = self.comm.bcast(uuid.uuid4().hex[:12] if self.rank == 0 else None, root=0)
            first_of_node = node.allreduce(self.rank, op=MPI.MIN)
            node.Free()
            local = len(set(self.row_comm.allgather(first_of_node))) == 1
            if local:
                name = f"torus-train-mpi-{node_id}-row{self.row}"
                cap = shm_capacity(grid.x)
                # MPI's own shared-memory barrier (microseconds) keeps the row in MPI's progress model
                kw = dict(capacity=cap, timeout=timeout, sync=self.row_comm.Barrier)
                if self.col == 0:
                    self.shm_row = ShmRow(name, 0, grid.row_ranks(self.row), **kw)
                self.row_comm.Barrier()
                if self.col != 0:
                    self.shm_row = ShmRow(name, self.col, grid.row_ranks(self.row), **kw)
                self.row_comm.Barrier()
                self.shm_row.connect()
                self.row_comm.Barrier()
                self.shm_row.unlink()
                self.notes.append(f"row {self.row} lies inside one node: shared memory, {cap >> 10} KiB pieces; columns on MPI")
            else:
                self.notes.append(f"row {self.row} spans nodes: rows use MPI collectives")

    @property
    def world_size(self) -> int:
        return self.grid.size

    # --- the transport interface used by torus_train.comm.algos -----------------------------------
    def world_allreduce(self, t: torch.Tensor) -> None:
        arr, typ, op = _msg(t)
        self.comm.Allreduce(_MPI().IN_PLACE, [arr, typ], op=op)

    def world_max(self, t: torch.Tensor) -> None:
        arr, typ, _ = _msg(t)
        self.comm.Allreduce(_MPI().IN_PLACE, [arr, typ], op=_MPI().MAX)

    def col_allreduce(self, t: torch.Tensor) -> None:
        if self.grid.y > 1:
            arr, typ, op = _msg(t)
            self.col_comm.Allreduce(_MPI().IN_PLACE, [arr, typ], op=op)

    def row_reduce_scatter(self, flat: torch.Tensor, bounds) -> None:
        counts = [b - a for a, b in bounds]
        a, b = bounds[self.col]
        send, typ, op = _msg(flat.clone())
        recv, _, _ = _msg(flat[a:b])
        self.row_comm.Reduce_scatter([send, typ], [recv, typ], recvcounts=counts, op=op)

    def row_all_gather(self, flat: torch.Tensor, bounds) -> None:
        counts = [b - a for a, b in bounds]
        displs = [a for a, _ in bounds]
        a, b = bounds[self.col]
        mine, typ, _ = _msg(flat[a:b].clone())
        whole, _, _ = _msg(flat)
        self.row_comm.Allgatherv([mine, typ], [whole, counts, displs, typ])

    def row_reduce_to_leader(self, t: torch.Tensor) -> None:
        arr, typ, op = _msg(t)
        if self.col == 0:
            self.row_comm.Reduce(_MPI().IN_PLACE, [arr, typ], op=op, root=0)
        else:
            self.row_comm.Reduce([arr, typ], None, op=op, root=0)

    def row_broadcast_from_leader(self, t: torch.Tensor) -> None:
        arr, typ, _ = _msg(t)
        self.row_comm.Bcast([arr, typ], root=0)

    def close(self) -> None:
        if self.shm_row is not None:
            self.shm_row.close()
            self.shm_row = None
