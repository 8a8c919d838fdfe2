#!/bin/bash
# Plain mpirun, two ways:
#  1. let torus-train build the command from a hostfile ('host slots=K' per line):
#       scripts/mpirun/torus_train_mpirun.sh hosts.txt scripts/specs/resnet50_8gpu.toml
#  2. or start the ranks yourself; each `torus-train run` process then acts as one rank
#     (rank, size and local rank from OMPI_COMM_WORLD_*; rank 0 broadcasts the rendezvous with mpi4py):
#       mpirun -np 8 --map-by ppr:4:node --bind-to none --hostfile hosts.txt -x OMP_NUM_THREADS=4 \
#           torus-train run --spec scripts/specs/resnet50_8gpu.toml
set -euo pipefail
HOSTFILE=${1:?usage: $0 HOSTFILE [SPEC] [more torus-train run flags]}
SPEC=${2:-scripts/specs/resnet50_8gpu.toml}
shift $(( $# >= 2 ? 2 : 1 ))
torus-train run --spec "$SPEC" --launcher mpirun --hostfile "$HOSTFILE" "$@"
