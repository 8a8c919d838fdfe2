#!/usr/bin/env bash
# The all-reduce comparison of README.md: flat vs torus vs hierarchical, float32 1 KiB .. 64 MiB, on gloo and on
# MPI, 4 ranks on 2x2 and 8 ranks on 2x4, each one run with the algorithms interleaved at every size.
# Usage: scripts/bench/allreduce_sweeps.sh [OUTDIR] [extra bench flags...]   (default OUTDIR docs/bench)
# SWEEP_BACKENDS and SWEEP_GRIDS pick fewer (defaults "gloo mpi" and "2x2 2x4"); extra flags come last and win:
#   SWEEP_BACKENDS=gloo SWEEP_GRIDS=2x1 scripts/bench/allreduce_sweeps.sh /tmp/sweep -b 1K -e 1K -n 1 -w 0   # a toy run
set -euo pipefail
out=${1:-docs/bench}; shift || true
mkdir -p "$out"
for backend in ${SWEEP_BACKENDS:-gloo mpi}; do
  for grid in ${SWEEP_GRIDS:-2x2 2x4}; do
    n=$(( ${grid%x*} * ${grid#*x} ))
    echo "=== $backend $grid ($n ranks) ==="
    torus-train bench allreduce --backend "$backend" --grid "$grid" --nprocs "$n" -b 1K -e 64M -f 2 -n 20 -w 5 \
      --algo flat,torus,hierarchical --json "$out/allreduce_${backend}_${grid}.json" "$@" 2>/dev/null \
      | sed -n '/busbw ratio/,$p'
  done
done
