#!/usr/bin/env bash
# The acceptance test for one GPU: `torus-train check --acceptance` (torus_train/check/acceptance.py; every
# check, its fields and pass line: docs/check.md), run from this checkout. Its flags pass through:
#
#   bash scripts/bench/gpu_check.sh [--out DIR] [--json FILE] [--quick] [--rehearse] [--parts syncs,speed,...]
#
# A table of the checks on stdout, progress on stderr, the JSON (schema 3) in DIR/summary.json and at --json.
# Exit codes: 0 every check asked for passed (or no GPU, or a rehearsal ran), 1 a check failed, 2 usage.
set -u
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m torus_train check --acceptance "$@"
