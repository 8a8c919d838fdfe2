#!/usr/bin/env bash
# Checkpoint save and resume on the namespace cluster (scripts/dev/cluster.sh): bytes each rank read from
# checkpoint files on resume and seconds in the checkpoint path, for 2 nodes x 1 and 2 nodes x 2 ranks.
#
#   flock /tmp/torus-cluster.lock scripts/experiments/measure_checkpoint_path.sh OUT.jsonl [TREE LABEL]...
#
# Brings the cluster up (2 nodes, no Slurm), and for each TREE (a checkout of torus-train; default: this one,
# labelled "this") and each layout runs from node1 with mpirun: `run` to step 2 (a checkpoint at the end),
# then `run --resume` to step 3; ResNet-50 (a checkpoint of about 205 MB: weights and momentum) at 32 px on
# synthetic data, 4 images per rank. Every rank logs "checkpoint at step N: S s in the checkpoint path" and
# "resumed from ...; B bytes read from checkpoint files by this rank, S s in the checkpoint path" (train/state.py;
# a tree to compare must log the same lines); one JSON line per rank and layout goes to OUT.jsonl. Tears the
# cluster down at the end, also on failure. Needs root; hold the cluster lock (only one cluster per machine).
# MEASURE_DRY=1: no cluster; every `run` above is checked here with --dry-run (flags, spec, hostfile), nothing
# measured and OUT left empty: how the tests run this script on a machine without the cluster.
set -euo pipefail
OUT=${1:?usage: measure_checkpoint_path.sh OUT.jsonl [TREE LABEL]...}; shift
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
[ $# -eq 0 ] && set -- "$HERE" this
CLUSTER="$HERE/scripts/dev/cluster.sh"
DRY=${MEASURE_DRY:-0}
WORK=$(mktemp -d /tmp/ckpt-path-XXXXXX)
: > "$OUT"
if [ "$DRY" = 1 ]; then
    trap 'rm -rf "$WORK"' EXIT
    on_node() { shift; "$@" --dry-run; }  # NODE CMD...: here, as a dry run
else
    trap '"$CLUSTER" down >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
    trap 'exit 1' TERM INT  # the EXIT trap tears the cluster down on a signal too
    TTC_SLURM=0 "$CLUSTER" up 2 >/dev/null
    on_node() { "$CLUSTER" exec "$@"; }
fi

run() {  # TREE OUTDIR SLOTS STEPS [--resume]
    local tree=$1 out=$2 slots=$3 steps=$4; shift 4
    local n=$((2 * slots))
    # from inside the tree: `python -m` puts the working folder first on sys.path, before PYTHONPATH
    cd "$tree" && on_node node1 env PYTHONPATH="$tree" OMP_NUM_THREADS=1 python3 -m torus_train run \
        --launcher mpirun --hostfile "$WORK/hosts$slots" --gpus $n --grid "${slots}x2" --data synthetic \
        --model resnet50 --image-size 32 --out "$out" --steps "$steps" \
        --set 'launch.env=["PYTHONPATH", "OMP_NUM_THREADS"]' --set grid.gpus_per_node="$slots" \
        --set "schedule.stages=[{until_epoch=1,global_batch=$((4 * n))}]" --set data.synthetic_samples=256 \
        --set checkpoint.every_epochs=0 --set checkpoint.at_end=true --set eval.every_epochs=0 \
        --set job.log_every=1 "$@" > "$out.stdout" 2>&1 || { tail -20 "$out.stdout" >&2; return 1; }
}

while [ $# -ge 2 ]; do
    tree=$1 label=$2; shift 2
    for slots in 1 2; do
        printf 'node1 slots=%d\nnode2 slots=%d\n' "$slots" "$slots" > "$WORK/hosts$slots"
        out="$WORK/$label-$slots"
        echo "measure: $label, 2 nodes x $slots ranks" >&2
        run "$tree" "$out" "$slots" 2
        run "$tree" "$out" "$slots" 3 --resume
        [ "$DRY" = 1 ] && { echo "measure: dry run of $label, 2 nodes x $slots ranks passed" >&2; continue; }
        LABEL=$label SLOTS=$slots RUN=$out python3 - >> "$OUT" <<'EOF'
import json, os, re
from pathlib import Path
out, slots = Path(os.environ["RUN"]), int(os.environ["SLOTS"])
size = (out / "checkpoints" / "step-00000002.pt").stat().st_size  # the one resumed from (kept: keep = 2)
for log in sorted((out / "logs").glob("rank*.log")):
    rank = int(log.stem[4:])
    text = log.read_text()
    save = [float(s) for s in re.findall(r"checkpoint at step \d+: ([\d.]+) s in the checkpoint path", text)]
    m = re.search(r"; (\d+) bytes read from checkpoint files by this rank, ([\d.]+) s in the checkpoint path", text)
    print(json.dumps({"tree": os.environ["LABEL"], "nodes": 2, "ranks_per_node": slots, "rank": rank,
                      "node": rank // slots + 1, "checkpoint_bytes": size, "save_s": save,
                      "resume_bytes_read": int(m.group(1)) if m else None,
                      "resume_s": float(m.group(2)) if m else None}))
EOF
    done
done
echo "measure: done, $(wc -l < "$OUT") rank lines in $OUT" >&2
