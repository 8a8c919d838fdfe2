"""The MPI transport (mpi4py communicators, rows and columns by Comm.Split; calls recorded once, then replayed).

It serves `torus-train bench allreduce --backend mpi`; training itself runs on torch.distributed groups.
"""
