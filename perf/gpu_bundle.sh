#!/usr/bin/env bash
# `make gpu-bundle`: everything a GPU machine without network needs for perf/gpu_build.sh and
# perf/gpu_run.sh, in .gpu/bundle/ (git ignores it; a device run carries it, ≤ 64 MiB with the repo):
#   llama-py.tar.gz   llama-cpp-python's pure-Python llama_cpp/ package (it finds the built libraries via
#                     LLAMA_CPP_LIB_PATH)
#   wheels/           Python 3.12 x86-64 manylinux wheels of cllm's and the load generator's
#                     dependencies (httpx: perf/speculative.py), less numpy (the machine has it)
#   ../llama-src.tar.gz  the llama.cpp that llama-cpp-python (pyproject.toml's pin) vendors, pruned to one CMake
#                     build (libllama + llama-server + llama-batched-bench): what perf/gpu_prebuild.sh compiles
#                     here; beside the bundle, since with the prebuilt libraries a device call needs no source
#                     (without them, call 1 carries it too and the device builds)
#   ../model-1/, ../model-2/, ...  the embedded model in parts, one a device call (perf/gpu_model_parts.py)
# On the GPU machine, from the repository root, with these ignored paths sent along:
#   call 1, with .gpu/bundle and .gpu/model-1:   bash perf/gpu_build.sh                (≤ ~7 min)
#   call 2, with .gpu/model-2, on the same disk: bash perf/gpu_run.sh OUTDIR           (≤ 6 min)
#   call 3, with .gpu/model-3 if there is one:   bash perf/gpu_run.sh OUTDIR2 --parts speculation,restart
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${GPU_BUNDLE:-.gpu/bundle}
CACHE=perf/cache/src
VERSION=$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml | cut -d= -f3)
SDIST=$CACHE/llama_cpp_python-$VERSION.tar.gz

mkdir -p "$CACHE" "$OUT/wheels"
if [ ! -f "$SDIST" ]; then
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$CACHE" "llama-cpp-python==$VERSION"
fi

# Source: drop what none of the three targets compiles (docs, models, tests, other backends, the UI's
# sources: the server is built without its web UI, whose assets would be downloaded at build time).
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
tar -xzf "$SDIST" -C "$STAGE"
SRC=$STAGE/llama_cpp_python-$VERSION
L=$SRC/vendor/llama.cpp
rm -rf "$L"/{docs,models,media,tests,benches,examples,pocs,app,conversion,ci,skills,requirements,.devops,.github} \
       "$L"/gguf-py "$L"/tools/ui/{src,tests,static,package-lock.json} \
       "$L"/tools/{tts,rpc,tuning}
for b in "$L"/ggml/src/ggml-*/; do
    case $(basename "$b") in ggml-cpu|ggml-cuda|ggml-blas) ;; *) rm -rf "$b" ;; esac
done
# tools/CMakeLists.txt adds every tool; keep the ones whose sources remain.
sed -i.bak -e '/add_subdirectory(tts)/d' -e '/add_subdirectory(rpc)/d' -e '/add_subdirectory(tuning)/d' "$L/tools/CMakeLists.txt"
rm -f "$L/tools/CMakeLists.txt.bak"
find "$L" -name '*.gguf' -delete
mkdir -p "$STAGE/pkg"
mv "$L" "$STAGE/pkg/llama.cpp"
mv "$SRC/llama_cpp" "$STAGE/pkg/llama_cpp"
tar -C "$STAGE/pkg" -czf "$(dirname "$OUT")/llama-src.tar.gz" llama.cpp
tar -C "$STAGE/pkg" -czf "$OUT/llama-py.tar.gz" llama_cpp
rm -f "$OUT/llama-src.tar.gz"  # where an older bundle kept the source

# Wheels: the versions this venv runs the tests with (the top names and all they require), resolved
# for the device's interpreter (GPU_PYVER, default 3.12; the CPU dry run names its own).
PYVER=${GPU_PYVER:-3.12}
TAG=cp${PYVER/./}
PINS=$("$PY" - <<'EOF'
import importlib.metadata as md, re
todo = ["msgspec", "starlette", "uvicorn", "uvloop", "httptools", "psutil", "pyyaml", "jinja2",
        "prometheus_client", "diskcache", "typing-extensions", "aiohttp", "tqdm", "httpx"]
seen = {}
while todo:
    name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0]
    key = name.lower().replace("_", "-")
    if key in seen or key == "numpy":
        continue
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue  # an optional or platform-only requirement this venv does not have
    seen[key] = dist.version
    todo += [r for r in dist.requires or [] if "extra ==" not in r]
print(" ".join(f"{k}=={v}" for k, v in sorted(seen.items())))
EOF
)
rm -f "$OUT"/wheels/*.whl
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --abi "$TAG" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 --platform any -d "$OUT/wheels" $PINS
echo "gpu bundle in $OUT: $(du -sh "$OUT" | cut -f1) ($(ls "$OUT"/wheels | wc -l) wheels); llama.cpp's source beside it: $(du -sh "$(dirname "$OUT")/llama-src.tar.gz" | cut -f1)"

# The embedded model (for the speculation part: synthetic weights copy nothing), in parts a device call each.
"$PY" -m perf.gpu_model_parts "$OUT"
