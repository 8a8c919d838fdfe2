"""The transport contract: the operations an all-reduce algorithm may use, and nothing else.

An algorithm (torus_train.comm.algos; its entry in torus_train.job.algorithms) is a function
``algorithm(buf, transport) -> None`` that sums `buf` over all ranks in place by calling the operations below.
It never asks which transport it runs on. Implementations:

- torus_train.comm.groups.GridGroups: torch.distributed (gloo on CPU, NCCL on GPU) row and column groups; its
  row exchange is either the row's process group (GroupRow) or, for a gloo row inside one host, shared memory
  (torus_train.comm.shm.ShmRow). Both implement RowExchange, so the algorithms have one path of row operations;
- torus_train.comm.mpi.transport.MpiGrid: MPI communicators through mpi4py (CPU buffers), recording an
  algorithm's calls once per buffer and replaying them.

Buffers: `buffer(tensor)` gives what the operations take (a 1-D tensor view on torch.distributed, numpy views
on MPI): the algorithms only take its length (`len`) and slice it with ``buf[a:b]`` (a view: writes land in
the tensor). Chunks: `bounds` is ``torus_train.comm.chunks.chunk_bounds(len(piece), grid.x)``, one (start,
stop) per member of the row, member i = the rank in column i.

Pieces: a row exchange may hold only so much at once (a shared-memory row has fixed slots), so an algorithm
that uses the row runs its phases piece by piece over ``transport.pieces(buf)`` (one piece, `buf` itself, on
transports without such a limit). A row operation that starts on a piece (reduce-scatter, reduce to leader)
must be followed by its closing one on the same piece (all-gather, broadcast) before the next piece starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from torus_train.job.topology import Grid


@runtime_checkable
class RowExchange(Protocol):
    """Collectives along this rank's row (X ranks; member i sits in column i, member 0 is the row leader)."""

    kind: str
    """What carries the row: "shm" (shared memory) or the backend's name, for logs and tests."""

    def pieces(self, buf) -> Iterable:
        """`buf` as consecutive views, each small enough for one exchange."""

    def reduce_scatter(self, piece, bounds) -> None:
        """Sum the row's pieces: chunk `bounds[me]` of the sum lands in my piece (the rest is left as it was)."""

    def all_gather(self, piece, bounds) -> None:
        """Every member holds chunk `bounds[me]`; afterwards all hold every chunk."""

    def reduce_to_leader(self, piece) -> None:
        """Sum the row's pieces into the leader's piece (column 0)."""

    def broadcast_from_leader(self, piece) -> None:
        """Copy the leader's piece to every member."""

    def close(self) -> None:
        """Release what the exchange holds (segments, descriptors)."""


@runtime_checkable
class Transport(Protocol):
    """One rank's view of the grid: where it sits and the collectives the algorithms are written against."""

    grid: Grid
    """The grid of the job (x ranks per row, y per column)."""
    rank: int
    """Global rank."""
    row: int
    """Row index of this rank."""
    col: int
    """Column index of this rank (column 0 holds the row leaders)."""
    backend: str
    """"gloo", "nccl", "mpi": for logs and for where buffers live (nccl: on the GPU)."""
    notes: list
    """What was decided while building it, for logs."""

    def buffer(self, tensor) -> Any:
        """What the operations take for a contiguous tensor (ValueError for a non-contiguous one)."""

    def run(self, algorithm: Callable, buf) -> None:
        """Run ``algorithm(buf, self)`` (MPI records it once per buffer and replays it)."""

    def pieces(self, buf) -> Iterable:
        """`buf` as the pieces its row exchange takes at once, in order (see the module docstring)."""

    def world_allreduce(self, buf) -> None:
        """The backend's own all-reduce (SUM) over every rank."""

    def world_max(self, buf) -> None:
        """MAX over every rank (the bench's timing bookkeeping, never part of an algorithm)."""

    def col_allreduce(self, buf) -> None:
        """SUM along this rank's column (nothing on a grid of one row)."""

    def row_reduce_scatter(self, piece, bounds) -> None:
        """RowExchange.reduce_scatter along this rank's row."""

    def row_all_gather(self, piece, bounds) -> None:
        """RowExchange.all_gather along this rank's row."""

    def row_reduce_to_leader(self, piece) -> None:
        """RowExchange.reduce_to_leader along this rank's row."""

    def row_broadcast_from_leader(self, piece) -> None:
        """RowExchange.broadcast_from_leader along this rank's row."""

    def close(self) -> None:
        """Release the transport's resources (not the process group itself)."""
