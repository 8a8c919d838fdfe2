#!/bin/bash
# ABCI-style PBS/UGE job: rt_F nodes with 4 V100 each; the node file lists every host once per slot,
# so `torus-train run` (auto) picks mpirun with --hostfile $PBS_NODEFILE and maps 4 ranks per node.
#   qsub -g GROUP -l rt_F=544 -l h_rt=01:00:00 scripts/pbs/abci_torus_train.sh scripts/specs/imagenet_2176.toml
#$ -l rt_F=2
#$ -l h_rt=01:00:00
#$ -j y
#$ -cwd
#PBS -l select=2:ncpus=40:ngpus=4
#PBS -l walltime=01:00:00
#PBS -j oe
set -euo pipefail
cd "${PBS_O_WORKDIR:-$PWD}"

source /etc/profile.d/modules.sh 2>/dev/null || true
module load cuda/12.1 openmpi singularitypro 2>/dev/null || true

SPEC=${1:-scripts/specs/imagenet_2176.toml}
if [[ -n "${PBS_NODEFILE:-}" ]]; then
    HOSTFILE=$PBS_NODEFILE                       # PBS: one line per slot already
elif [[ -n "${SGE_JOB_HOSTLIST:-}" ]]; then
    HOSTFILE=$(mktemp)                           # ABCI (UGE): one line per node -> 'host slots=4'
    awk '{ print $1 " slots=4" }' "$SGE_JOB_HOSTLIST" > "$HOSTFILE"
else
    echo "no PBS_NODEFILE or SGE_JOB_HOSTLIST: submit this script with qsub" >&2; exit 2
fi
GPUS=$(awk '{ n += ($2 ~ /^slots=/) ? substr($2, 7) : 1 } END { print n }' "$HOSTFILE")

CONTAINER_ARGS=()
if [[ -n "${TORUS_TRAIN_IMAGE:-}" ]]; then CONTAINER_ARGS=(--container "$TORUS_TRAIN_IMAGE"); fi

torus-train run --spec "$SPEC" --launcher mpirun --hostfile "$HOSTFILE" --gpus "$GPUS" --gpus-per-node 4 \
    --out "runs/abci-${JOB_ID:-${PBS_JOBID:-manual}}" "${CONTAINER_ARGS[@]}"
