"""All-reduce on torch.distributed groups: `allreduce(tensor, algo, groups)` (see torus_train.comm.algos)."""
from torus_train.comm.algos import ALGORITHMS, allreduce  # noqa: F401
