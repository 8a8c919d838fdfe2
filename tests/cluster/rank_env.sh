#!/bin/sh
# launch.python for the cluster tests: write this rank's environment to $TTC_ENV_DUMP/rank-R.env, then run
# the worker with the real interpreter. Shows what reaches the ranks through srun/mpirun.
r=${SLURM_PROCID:-${OMPI_COMM_WORLD_RANK:-x}}
env > "$TTC_ENV_DUMP/rank-$r.env"
exec "$TTC_PYTHON" "$@"
