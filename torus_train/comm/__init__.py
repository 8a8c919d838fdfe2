"""Collectives over the grid: flat (the backend's own all-reduce), 2D torus and hierarchical.

torch.distributed (gloo on CPU, NCCL on GPU): see torus_train.comm.torch_algos and groups;
MPI communicators through mpi4py (CPU buffers): see torus_train.comm.mpi_algos;
the DDP communication hook: torus_train.comm.hooks.
"""

ALGOS = ("flat", "torus", "hierarchical")
BACKENDS = ("gloo", "mpi", "nccl")
