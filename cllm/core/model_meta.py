"""What llama.cpp says of a loaded model: metadata, the memory its KV cache takes, GPU layers.

Shared by the engine (which reports them) and the frontend (which checks a
model fits in memory before it asks for its engines, from a vocabulary-only
load that has the same hyperparameters).
"""

from __future__ import annotations

import ctypes

import llama_cpp as L

from cllm.core.config import ServeConfig

# Bytes per cached element: q8_0 keeps 32 values in 34 bytes, q4_0 in 18.
CACHE_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def meta(model, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode(errors="replace") if n >= 0 else ""


def kv_cache_bytes(model, cells: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """K and V of every layer for every cell, in the cache types asked for.

    From the file's metadata only, so a vocabulary-only load (whose
    hyperparameters llama.cpp leaves unset) gives the same answer.
    """
    arch = meta(model, "general.architecture")
    n_head = _int(meta(model, f"{arch}.attention.head_count")) or 1
    n_head_kv = _int(meta(model, f"{arch}.attention.head_count_kv")) or n_head
    head_k = (
        _int(meta(model, f"{arch}.attention.key_length")) or _int(meta(model, f"{arch}.embedding_length")) // n_head
    )
    head_v = _int(meta(model, f"{arch}.attention.value_length")) or head_k
    per_cell = n_head_kv * (head_k * CACHE_TYPE_BYTES[type_k] + head_v * CACHE_TYPE_BYTES[type_v])
    return int(_int(meta(model, f"{arch}.block_count")) * cells * per_cell)


def _int(value: str) -> int:
    """A metadata integer; 0 if absent or not one (a per-layer array, for instance)."""
    try:
        return int(value)
    except ValueError:
        return 0


def gpu_layers(config: ServeConfig) -> int:
    """--n-gpu-layers, or every layer when llama.cpp was built with a GPU backend (llama.cpp caps it)."""
    if config.n_gpu_layers is not None:
        return config.n_gpu_layers
    return 999 if L.llama_supports_gpu_offload() else 0
