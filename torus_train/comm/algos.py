"""Flat, 2D-torus and hierarchical all-reduce of one flat tensor, written once for every transport.

All three SUM in place and leave the identical result on every rank. Any length works (1, 7, primes, not
divisible by X) and float32, float16 and bfloat16. `comm` is a grid communicator: GridGroups
(torch.distributed: gloo, NCCL; torus_train.comm.groups) or MpiGrid (mpi4py; torus_train.comm.mpi.transport).

torus (Mikami et al. 2018, Fig. 2), for a grid of Y rows of X ranks:
  1. reduce-scatter along each row: rank (r, c) ends with chunk c of its row's sum;
  2. all-reduce along each column on that chunk, all X columns at once: chunk c of the global sum;
  3. all-gather along each row: everyone has the whole global sum.
hierarchical (the scheme the paper compares against):
  1. reduce to the row leader (column 0); 2. all-reduce among the leaders along column 0;
  3. broadcast from the leader along the row. Its step 2 carries the whole tensor, X times the torus's chunk.
On gloo, rows inside one host go through shared memory in pieces (torus_train.comm.shm), so only the columns
touch the network backend; other rows use the transport's own row exchange (docs/comm.md).
"""
from __future__ import annotations

import torch

from torus_train.comm.chunks import chunk_bounds


def allreduce(tensor: torch.Tensor, algo: str, comm) -> torch.Tensor:
    """Sum `tensor` over all ranks in place with the named algorithm; returns `tensor`."""
    fn = ALGORITHMS.get(algo)
    if fn is None:
        raise ValueError(f"unknown all-reduce algorithm {algo!r}; choose one of {', '.join(ALGORITHMS)}")
    comm.run(fn, comm.buffer(tensor))  # buffer() raises ValueError for a non-contiguous tensor
    return tensor


# The algorithms take the flat buffer that comm.buffer(tensor) gives and slice it: a 1-D view of the tensor
# for torch.distributed, numpy views for MPI, cached for a tensor reduced again (DDP's buckets, the bench).
# comm.run(algorithm, buf) calls the algorithm; MPI records the calls it makes once per buffer and replays
# them, because with ranks outnumbering cores every Python-side step between two MPI calls costs many times
# its own duration (figures in docs/comm.md).

def _nothing_to_do(buf, comm) -> bool:
    return len(buf) == 0 or comm.grid.size == 1


def flat_allreduce(buf, comm) -> None:
    """The backend's own all-reduce over the whole world: the baseline."""
    if _nothing_to_do(buf, comm):
        return
    comm.world_allreduce(buf)


def torus_allreduce(buf, comm) -> None:
    if _nothing_to_do(buf, comm):
        return
    x, y = comm.grid.x, comm.grid.y
    if x == 1:  # one column: the torus is a single vertical ring
        comm.col_allreduce(buf)
        return
    row = comm.shm_row
    if row is not None:  # (torch.distributed only: buf is a tensor)
        step = row.piece_elems(buf.dtype)
        for s in range(0, len(buf), step):
            piece = buf[s:s + step]
            a, b = row.reduce_scatter(piece)              # 1. row, through shared memory
            if y > 1 and b > a:
                comm.col_allreduce(piece[a:b])            # 2. column, on my 1/X chunk
            row.all_gather(piece, (a, b))                 # 3. row again
        return
    bounds = chunk_bounds(len(buf), x)
    a, b = bounds[comm.col]
    comm.row_reduce_scatter(buf, bounds)                  # 1. my chunk of the row's sum lands in buf[a:b]
    if y > 1 and b > a:
        comm.col_allreduce(buf[a:b])                      # 2.
    comm.row_all_gather(buf, bounds)                      # 3.


def hierarchical_allreduce(buf, comm) -> None:
    if _nothing_to_do(buf, comm):
        return
    x, y = comm.grid.x, comm.grid.y
    if x == 1:
        comm.col_allreduce(buf)
        return
    leader = comm.col == 0
    row = comm.shm_row
    if row is not None:
        step = row.piece_elems(buf.dtype)
        for s in range(0, len(buf), step):
            piece = buf[s:s + step]
            row.reduce_to_first(piece)                    # 1. to the row leader
            if leader and y > 1:
                comm.col_allreduce(piece)                 # 2. leaders, whole piece
            row.broadcast_from_first(piece)               # 3. back along the row
        return
    comm.row_reduce_to_leader(buf)
    if leader and y > 1:
        comm.col_allreduce(buf)
    comm.row_broadcast_from_leader(buf)


ALGORITHMS = {
    "flat": flat_allreduce,
    "torus": torus_allreduce,
    "hierarchical": hierarchical_allreduce,
}
