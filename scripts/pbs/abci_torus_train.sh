#!/bin/bash
# PBS Pro (and ABCI's UGE) job: nodes with 4 GPUs, one MPI rank per GPU, launched by mpirun.
#   qsub -l select=2:ncpus=40:ngpus=4:mpiprocs=4 scripts/pbs/abci_torus_train.sh        # (PBS Pro: -v SPEC=...)
#   qsub -g GROUP -l rt_F=544 -l h_rt=01:00:00 scripts/pbs/abci_torus_train.sh scripts/specs/imagenet_2176.toml
# mpiprocs=4 makes $PBS_NODEFILE list each host 4 times (one line per rank); without it each host is listed
# once. Ranks per node are counted from the node file, so the spec's gpus_per_node must agree with it.
# Arguments after the spec go to `torus-train run`.
# Environment: qsub does not carry the submitting shell's environment. Set TORUS_TRAIN_ACTIVATE to the
# environment's activate script (venv or conda), or make torus-train reachable on PATH otherwise.
# TORUS_TRAIN_MODULES: the modules to load, pinned to versions; a module that fails to load stops the job
# (empty = load none). TORUS_TRAIN_IMAGE=/path/x.sif runs every rank in that container.
#$ -l rt_F=2
#$ -l h_rt=01:00:00
#$ -j y
#$ -cwd
#PBS -l select=2:ncpus=40:ngpus=4:mpiprocs=4
#PBS -l walltime=01:00:00
#PBS -j oe
set -euo pipefail
cd "${PBS_O_WORKDIR:-$PWD}"

MODULES=${TORUS_TRAIN_MODULES-"cuda/12.1/12.1.1 hpcx/2.12 singularitypro/3.11"}
if [[ -n "$MODULES" ]]; then
    if ! type module >/dev/null 2>&1; then source /etc/profile.d/modules.sh; fi
    for m in $MODULES; do
        module load "$m" || { echo "module load $m failed; set TORUS_TRAIN_MODULES to this site's names" >&2; exit 2; }
    done
fi
if [[ -n "${TORUS_TRAIN_ACTIVATE:-}" ]]; then source "$TORUS_TRAIN_ACTIVATE"; fi
command -v torus-train >/dev/null || {
    echo "torus-train is not on PATH: qsub -v TORUS_TRAIN_ACTIVATE=/path/venv/bin/activate ..." >&2; exit 2; }

SPEC=${1:-${SPEC:-scripts/specs/imagenet_2176.toml}}
shift $(( $# > 0 ? 1 : 0 ))
if [[ -n "${PBS_NODEFILE:-}" ]]; then
    HOSTFILE=$PBS_NODEFILE                       # PBS Pro: one line per MPI process (mpiprocs per host)
elif [[ -n "${SGE_JOB_HOSTLIST:-}" ]]; then
    HOSTFILE=$(mktemp)                           # ABCI (UGE): one line per node -> 'host slots=4'
    awk '{ print $1 " slots=4" }' "$SGE_JOB_HOSTLIST" > "$HOSTFILE"
else
    echo "no PBS_NODEFILE or SGE_JOB_HOSTLIST: submit this script with qsub" >&2; exit 2
fi
# ranks per node = lines (or slots) of the first host; the world size = all of them
read -r GPUS PER_NODE < <(awk '{ n = ($2 ~ /^slots=/) ? substr($2, 7) : 1; total += n; if (NR == 1) first = $1;
    if ($1 == first) mine += n } END { print total, mine }' "$HOSTFILE")
if (( PER_NODE == 1 )) && [[ -n "${PBS_NODEFILE:-}" ]]; then
    echo "note: $PBS_NODEFILE lists each host once; request mpiprocs=GPUs per node (select=...:mpiprocs=4)" >&2
fi

CONTAINER_ARGS=()
if [[ -n "${TORUS_TRAIN_IMAGE:-}" ]]; then CONTAINER_ARGS=(--container "$TORUS_TRAIN_IMAGE"); fi

exec torus-train run --spec "$SPEC" --launcher mpirun --hostfile "$HOSTFILE" --gpus "$GPUS" \
    --gpus-per-node "$PER_NODE" --out "runs/abci-${JOB_ID:-${PBS_JOBID:-manual}}" "${CONTAINER_ARGS[@]}" "$@"
