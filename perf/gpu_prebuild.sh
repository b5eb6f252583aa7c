#!/usr/bin/env bash
# Compiles the bundle's llama.cpp with CUDA for sm_90 HERE, on a machine with nvcc and no GPU, so that a
# device run spends its minutes measuring, not compiling (2 cores: about an hour; the device: ~6 of its 15
# minutes). Run after perf/gpu_bundle.sh; adds .gpu/bundle/llama-cuda.tar.xz (libllama/libggml*,
# llama-server, llama-batched-bench), which perf/gpu_build.sh unpacks instead of building.
#
# What nvcc alone lacks, kept under perf/cache/cuda/ and passed to CMake (the toolkit stays untouched):
#   cuBLAS     PyPI's nvidia-cublas wheel of the device's CUDA (13.0): headers through CPATH, libraries by path
#   libcuda    the driver (ggml-cuda calls it for virtual memory): a stub of those few functions, to link
#              only (soname libcuda.so.1); the device's own driver is what runs
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BUNDLE=${GPU_BUNDLE:-.gpu/bundle}
WORK=${GPU_CUDA_WORK:-.gpu/cuda}
TOOLS=perf/cache/cuda
JOBS=${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}
command -v nvcc >/dev/null || { echo "no nvcc on PATH" >&2; exit 1; }
SRC=$(dirname "$BUNDLE")/llama-src.tar.gz
[ -f "$SRC" ] || { echo "no $SRC: run perf/gpu_bundle.sh first" >&2; exit 1; }

if [ ! -f "$TOOLS/lib/libcublas.so" ]; then
    mkdir -p "$TOOLS/wheel"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$TOOLS/wheel" 'nvidia-cublas>=13.0,<13.1'
    "$PY" -m zipfile -e "$TOOLS"/wheel/nvidia_cublas-*.whl "$TOOLS/wheel/x"
    mkdir -p "$TOOLS/lib" "$TOOLS/include"
    cp "$TOOLS"/wheel/x/nvidia/cu13/include/* "$TOOLS/include/"
    cp "$TOOLS"/wheel/x/nvidia/cu13/lib/libcublas.so.13 "$TOOLS"/wheel/x/nvidia/cu13/lib/libcublasLt.so.13 "$TOOLS/lib/"
    ln -sf libcublas.so.13 "$TOOLS/lib/libcublas.so"
    ln -sf libcublasLt.so.13 "$TOOLS/lib/libcublasLt.so"
    rm -rf "$TOOLS/wheel"
fi
if [ ! -f "$TOOLS/stubs/libcuda.so" ]; then
    mkdir -p "$TOOLS/stubs"
    STUB=$(mktemp --suffix .c)
    for f in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve cuMemCreate \
             cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap; do
        echo "int $f(void) { return 0; }"
    done > "$STUB"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$TOOLS/stubs/libcuda.so" "$STUB"
    ln -sf libcuda.so "$TOOLS/stubs/libcuda.so.1"  # what the programs' link looks for (-rpath-link below)
    rm -f "$STUB"
fi

mkdir -p "$WORK"
# tar restores the archive's times, so a second run over the same source rebuilds nothing.
[ -d "$WORK/llama.cpp" ] || tar -xzf "$SRC" -C "$WORK" llama.cpp
export CPATH=$PWD/$TOOLS/include${CPATH:+:$CPATH}
# GGML_NATIVE off: the device's processor is not this one; every layer runs on the GPU anyway.
cmake -S "$WORK/llama.cpp" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCUDA_cublas_LIBRARY="$PWD/$TOOLS/lib/libcublas.so" -DCUDA_cublasLt_LIBRARY="$PWD/$TOOLS/lib/libcublasLt.so" \
    -DCUDA_cuda_driver_LIBRARY="$PWD/$TOOLS/stubs/libcuda.so" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$PWD/$TOOLS/stubs" \
    > "$WORK/configure.log" 2>&1 \
    || { tail -30 "$WORK/configure.log"; exit 1; }
cmake --build "$WORK/build" -j "$JOBS" --target llama llama-server llama-batched-bench > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log"; exit 1; }
BIN=$WORK/build/bin
# shellcheck disable=SC2046
tar -C "$BIN" -cf - $(cd "$BIN" && ls lib*.so* llama-server llama-batched-bench) | xz -T0 -6 > "$BUNDLE/llama-cuda.tar.xz"
echo "prebuilt CUDA llama.cpp: $(du -sh "$BUNDLE/llama-cuda.tar.xz" | cut -f1) in $BUNDLE/llama-cuda.tar.xz"
# The bundle grew: the embedded model's parts again, the first in what call 1 now has left.
"$PY" -m perf.gpu_model_parts "$BUNDLE"
