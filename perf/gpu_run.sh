#!/usr/bin/env bash
# Run 2 on the GPU machine (≤ 9 min), after perf/gpu_build.sh: perf/gpu_run.py with the libraries, binaries
# and Python packages that build left in $GPU_WORK. Results (results.md, results.json, plot.png, and the
# servers' logs in logs.tgz: a device call brings back at most 8 files) land in OUTDIR. GPU_RUN_DRY=1: tiny
# shapes and short counts, for a CPU build.
#   perf/gpu_run.sh OUTDIR [perf/gpu_run.py options, e.g. --models 8b --budget 200]
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: perf/gpu_run.sh OUTDIR [options]}
shift
WORK=${GPU_WORK:-.gpu/work}
PY=${PYTHON:-python3}
[ -x "$WORK/build/bin/llama-server" ] || { echo "no build in $WORK: run perf/gpu_build.sh first" >&2; exit 1; }
export LLAMA_CPP_LIB_PATH=$PWD/$WORK/build/bin
. perf/gpu_libs.sh "$WORK/build/bin"
export PYTHONPATH=$PWD:$PWD/$WORK/site${PYTHONPATH:+:$PYTHONPATH}
export GPU_BIN=$PWD/$WORK/build/bin GPU_MODELS=$PWD/$WORK/models
mkdir -p "$OUTDIR"
# The embedded model, once all its parts came with the calls so far: the speculation part needs real weights.
BUNDLE=${GPU_BUNDLE:-.gpu/bundle}
. perf/gpu_model_join.sh
# A bound beyond the run's own budget: SIGTERM makes it stop its servers and write what it has.
LIMIT=()
command -v timeout >/dev/null && LIMIT=(timeout -k 15 "${GPU_RUN_TIMEOUT:-520}")
status=0
"${LIMIT[@]}" "$PY" -m perf.gpu_run "$OUTDIR" "$@" || status=$?
[ -d "$OUTDIR/logs" ] && tar -czf "$OUTDIR/logs.tgz" -C "$OUTDIR" logs && rm -rf "$OUTDIR/logs"
exit $status
