# Sourced by perf/gpu_build.sh and perf/gpu_run.sh (WORK and BUNDLE set): the parts of the embedded model
# (perf/gpu_model_parts.py) that came with this call go into $WORK, where they stay for the later calls; once
# every part is there, $WORK/real-model.gguf is their join and GPU_REAL_MODEL, GPU_REAL_MODEL_SHA256 name it
# (perf/gpu_run.py checks the sum before its speculation part uses it).
for part in "$(dirname "$BUNDLE")"/model-*/part; do
    [ -f "$part" ] || continue
    dir=$(dirname "$part")
    cp "$part" "$WORK/real-model.part${dir##*-}"
    cp "$dir/sha256" "$dir/sizes" "$WORK/"
done
if [ -f "$WORK/sizes" ]; then
    joined=()
    k=0
    for size in $(cat "$WORK/sizes"); do
        k=$((k + 1))
        [ "$size" = 0 ] && continue
        [ -f "$WORK/real-model.part$k" ] && joined+=("$WORK/real-model.part$k") || { joined=(); break; }
    done
    if [ ${#joined[@]} -gt 0 ]; then
        cat "${joined[@]}" > "$WORK/real-model.gguf"
        GPU_REAL_MODEL=$(cd "$WORK" && pwd)/real-model.gguf GPU_REAL_MODEL_SHA256=$(cat "$WORK/sha256")
        export GPU_REAL_MODEL GPU_REAL_MODEL_SHA256
    fi
fi
