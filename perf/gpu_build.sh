#!/usr/bin/env bash
# On the GPU machine, before perf/gpu_run.sh: unpacks the bundle `make gpu-bundle` made, and either unpacks the
# CUDA build perf/gpu_prebuild.sh compiled ahead (seconds) or builds llama.cpp there, with CUDA for sm_90
# (≤ ~7 min on 16 cores): libllama/libggml* (cllm loads them through LLAMA_CPP_LIB_PATH), llama-server and
# llama-batched-bench, one build, so all three contestants run the same kernels.
# Everything lands in $GPU_WORK (.gpu/work, ignored by git, left on the machine for perf/gpu_run.sh).
# GPU_RUN_DRY=1: the same build on a CPU (GGML_CUDA off), as the dry run in tests/test_gpu_run.py does.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${GPU_BUNDLE:-.gpu/bundle}
WORK=${GPU_WORK:-.gpu/work}
PY=${PYTHON:-python3}
DRY=${GPU_RUN_DRY:-0}
JOBS=${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 4)}
START=$(date +%s)

mkdir -p "$WORK"
# Python: the wheels and llama-cpp-python's pure-Python package, onto one directory for PYTHONPATH.
if [ ! -f "$WORK/site/.installed" ]; then
    rm -rf "$WORK/site" "$WORK/llama.cpp"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$BUNDLE"/wheels/*.whl
    tar -xzf "$BUNDLE/llama-py.tar.gz" -C "$WORK/site"
    touch "$WORK/site/.installed"
fi

if [ -f "$BUNDLE/llama-cuda.tar.xz" ] && [ "$DRY" != 1 ]; then
    # Compiled ahead by perf/gpu_prebuild.sh: nothing to build here.
    mkdir -p "$WORK/build/bin"
    tar -xJf "$BUNDLE/llama-cuda.tar.xz" -C "$WORK/build/bin"
else
    if [ "$DRY" = 1 ]; then
        BACKEND=(-DGGML_CUDA=OFF)
    else
        BACKEND=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
    fi
    # The source travels beside the bundle (perf/gpu_bundle.sh): with call 1 only when there is no prebuilt.
    SRC=$(dirname "$BUNDLE")/llama-src.tar.gz
    [ -d "$WORK/llama.cpp" ] || tar -xzf "$SRC" -C "$WORK" || { echo "gpu_build: no $SRC to build from" >&2; exit 1; }
    GEN=()
    command -v ninja >/dev/null && GEN=(-G Ninja)
    LOG=$WORK/build.log
    {
        cmake -S "$WORK/llama.cpp" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
            -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
            -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "${BACKEND[@]}" &&
        cmake --build "$WORK/build" --config Release -j "$JOBS" \
            --target llama llama-server llama-batched-bench
    } > "$LOG" 2>&1 || { tail -40 "$LOG"; exit 1; }
fi
# The libraries find each other and CUDA's (cuBLAS may sit in a Python package rather than the toolkit).
. perf/gpu_libs.sh "$WORK/build/bin"

# The embedded model's part that came with this call, kept for gpu_run.sh, which joins the rest.
. perf/gpu_model_join.sh

# One check that the Python side loads the libraries just built, and (but in a dry run) finds the GPU: a run
# that would measure the CPU instead stops here, in seconds.
if [ "$DRY" != 1 ] && command -v ldd >/dev/null && ldd "$WORK/build/bin/libggml-cuda.so" | grep "not found"; then
    echo "gpu_build: CUDA libraries missing (above)" >&2; exit 1
fi
LLAMA_CPP_LIB_PATH=$PWD/$WORK/build/bin PYTHONPATH=$WORK/site GPU_RUN_DRY=$DRY "$PY" -c "
import os, sys, llama_cpp
llama_cpp.llama_backend_init()
gpu = bool(llama_cpp.llama_supports_gpu_offload())
print('llama_cpp loads', llama_cpp.__file__, 'gpu offload:', gpu)
sys.exit(0 if gpu or os.environ['GPU_RUN_DRY'] == '1' else 'gpu_build: llama.cpp sees no GPU')"
# The synthetic models too, while the machine is ours: the measuring run then spends its minutes measuring.
mkdir -p "$WORK/models"
if [ "$DRY" = 1 ]; then PRESETS=${GPU_SYNTH:-tiny}; else PRESETS=${GPU_SYNTH:-smollm2 8b 1b}; fi
for p in $PRESETS; do
    [ -f "$WORK/models/$p.gguf" ] || PYTHONPATH=$PWD "$PY" -m perf.synth_model "$p" "$WORK/models/$p.gguf"
done
ls "$WORK/build/bin" "$WORK/models"
echo "gpu_build: $(( $(date +%s) - START )) s"
