"""Collectives over the grid: flat (the backend's own all-reduce), 2D torus and hierarchical.

algos.py: the three algorithms, written once against a small transport interface;
groups.py: that interface on torch.distributed (gloo on CPU, NCCL on GPU) row and column groups;
mpi/: the same on MPI communicators through mpi4py (CPU buffers), with its C replay; serves the benchmark;
shm.py: rows inside one host, through shared memory; chunks.py: how a tensor is cut into chunks;
hooks.py: the DDP communication hook.
"""

ALGOS = ("flat", "torus", "hierarchical")
BACKENDS = ("gloo", "mpi", "nccl")
