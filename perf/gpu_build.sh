#!/usr/bin/env bash
# Run 1 on the GPU machine (≤ ~7 min on 16 cores): unpacks the bundle `make gpu-bundle` made and builds
# llama.cpp ONCE, with CUDA for sm_90: libllama/libggml* (cllm loads them through LLAMA_CPP_LIB_PATH),
# llama-server and llama-batched-bench, so all three contestants run the same kernels.
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
    tar -xzf "$BUNDLE/llama-src.tar.gz" -C "$WORK"
    mv "$WORK/llama_cpp" "$WORK/site/llama_cpp"
    touch "$WORK/site/.installed"
fi

if [ "$DRY" = 1 ]; then
    BACKEND=(-DGGML_CUDA=OFF)
else
    BACKEND=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
fi
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

# The embedded model's first part, when it came with this run (perf/gpu_bundle.sh); gpu_run.sh joins the rest.
PART1=$(dirname "$BUNDLE")/model-1/part
[ -f "$PART1" ] && cp "$PART1" "$WORK/real-model.part1"

# One check that the Python side loads the libraries just built.
LLAMA_CPP_LIB_PATH=$PWD/$WORK/build/bin PYTHONPATH=$WORK/site "$PY" -c \
    "import llama_cpp; llama_cpp.llama_backend_init(); print('llama_cpp loads', llama_cpp.__file__, 'gpu offload:', bool(llama_cpp.llama_supports_gpu_offload()))"
# The synthetic models too, while the machine is ours: the measuring run then spends its minutes measuring.
mkdir -p "$WORK/models"
if [ "$DRY" = 1 ]; then PRESETS=${GPU_SYNTH:-tiny}; else PRESETS=${GPU_SYNTH:-smollm2 8b 1b}; fi
for p in $PRESETS; do
    [ -f "$WORK/models/$p.gguf" ] || PYTHONPATH=$PWD "$PY" -m perf.synth_model "$p" "$WORK/models/$p.gguf"
done
ls "$WORK/build/bin" "$WORK/models"
echo "gpu_build: $(( $(date +%s) - START )) s"
