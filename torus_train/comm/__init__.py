"""Collectives over the grid: the all-reduce algorithms, the transport contract and its transports.

algos.py: the algorithms, written once against the transport contract (transport.py); each is registered with
its transport needs, cost-model phases and simulator in torus_train.job.algorithms;
groups.py: the contract on torch.distributed (gloo on CPU, NCCL on GPU) row and column groups;
shm.py: rows inside one host through shared memory (the row exchange of a gloo GridGroups);
mpi/: the contract on MPI communicators through mpi4py (CPU buffers), with its C replay; serves the benchmark;
chunks.py: how a tensor is cut into chunks; collectives.py: the row collectives under this torch's names;
hooks.py: the DDP communication hook; bucketing.py: the bucket rule (pure), by which buckets.py builds the run's
gradient buckets and the plan's timeline predicts them.
"""

BACKENDS = ("gloo", "mpi", "nccl")
