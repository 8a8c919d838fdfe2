#!/bin/bash
# one round: gloo or mpi, torus vs flat interleaved, 2 nodes x 2 ranks, links shaped by cluster.sh TTC_RATE
backend=$1; tag=$2
cd /work/main
timeout 900 bash scripts/dev/cluster.sh exec node1 mpirun -np 4 --map-by ppr:2:node --hostfile /tmp/b14/hosts \
  -x OMP_NUM_THREADS=1 -x PATH $3 \
  torus-train bench allreduce --grid 2x2 --algo flat,torus -b 64K -e 64M -f 4 -n 5 -w 2 -c 0 --backend $backend \
  --json /tmp/b14/$tag.json
