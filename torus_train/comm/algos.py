"""Flat, 2D-torus and hierarchical all-reduce of one flat tensor, written once over the transport contract.

All three SUM in place and leave the identical result on every rank. Any length works (1, 7, primes, not
divisible by X) and float32, float16 and bfloat16. `comm` is any transport (torus_train.comm.transport.Transport:
GridGroups on torch.distributed, with its rows on the row group or in shared memory; MpiGrid on mpi4py). Each
is registered with its transport needs, cost-model phases and simulator in torus_train.job.algorithms.

torus (Mikami et al. 2018, Fig. 2), for a grid of Y rows of X ranks:
  1. reduce-scatter along each row: rank (r, c) ends with chunk c of its row's sum;
  2. all-reduce along each column on that chunk, all X columns at once: chunk c of the global sum;
  3. all-gather along each row: everyone has the whole global sum.
hierarchical (the scheme the paper compares against):
  1. reduce to the row leader (column 0); 2. all-reduce among the leaders along column 0;
  3. broadcast from the leader along the row. Its step 2 carries the whole tensor, X times the torus's chunk.
Both run their phases piece by piece over comm.pieces(buf): one piece except where the row exchange holds a
bounded amount (a shared-memory row, torus_train.comm.shm), where each piece's column phase starts as soon as
its row phase ends (docs/comm.md).
"""

from __future__ import annotations

from functools import cache

import torch

from torus_train.comm.chunks import chunk_bounds
from torus_train.job.algorithms import ALGORITHMS, runnable
from torus_train.registry import load


def allreduce(tensor: torch.Tensor, algo: str, comm) -> torch.Tensor:
    """Sum `tensor` over all ranks in place with the named algorithm; returns `tensor`."""
    comm.run(algorithm(algo), comm.buffer(tensor))  # buffer() raises ValueError for a non-contiguous tensor
    return tensor


def algorithm(name: str):
    """The function of a runnable algorithm of the table (ValueError naming the runnable ones otherwise)."""
    entry = ALGORITHMS.get(name) if name in ALGORITHMS else None
    if entry is None or entry.run is None:
        raise ValueError(
            f"{name!r} is not an all-reduce algorithm that ranks run; choose one of {', '.join(runnable())}"
        )
    return _function(entry.run)


@cache  # once per reference: an all-reduce of a small bucket must not pay for an import lookup
def _function(ref):
    return load(ref)


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
    for piece in comm.pieces(buf):
        bounds = chunk_bounds(len(piece), x)
        a, b = bounds[comm.col]
        comm.row_reduce_scatter(piece, bounds)  # 1. my chunk of the row's sum lands in piece[a:b]
        if y > 1 and b > a:
            comm.col_allreduce(piece[a:b])  # 2. column, on my 1/X chunk
        comm.row_all_gather(piece, bounds)  # 3. row again


def hierarchical_allreduce(buf, comm) -> None:
    if _nothing_to_do(buf, comm):
        return
    x, y = comm.grid.x, comm.grid.y
    if x == 1:
        comm.col_allreduce(buf)
        return
    leader = comm.col == 0
    for piece in comm.pieces(buf):
        comm.row_reduce_to_leader(piece)  # 1. to the row leader
        if leader and y > 1:
            comm.col_allreduce(piece)  # 2. leaders, whole piece
        comm.row_broadcast_from_leader(piece)  # 3. back along the row
