# Sourced by perf/gpu_build.sh and perf/gpu_run.sh with llama.cpp's bin folder: puts that folder on
# LD_LIBRARY_PATH (the binaries were linked elsewhere, so their own run path is wrong), then each CUDA library
# ggml-cuda needs that the loader does not already know: the toolkit's folders first, then a Python
# package's (the device's PyTorch ships cuBLAS as nvidia-cublas).
_bin=$(cd "$1" && pwd)
export LD_LIBRARY_PATH=$_bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -f "$_bin/libggml-cuda.so" ]; then
    _py=${PYTHON:-python3}
    _site=$("$_py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
    for _lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
        ldconfig -p 2>/dev/null | grep -q "$_lib" && continue
        for _dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
                    /usr/local/cuda-13*/targets/x86_64-linux/lib; do
            [ -f "$_dir/$_lib" ] && { export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$_dir; continue 2; }
        done
        for _s in $_site; do
            for _dir in "$_s"/nvidia/cu13/lib "$_s"/nvidia/*/lib; do
                [ -f "$_dir/$_lib" ] && { export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$_dir; continue 3; }
            done
        done
        echo "gpu_libs: $_lib not found" >&2
    done
    unset _py _site _lib _dir _s
fi
unset _bin
