"""The draft model (--model-draft): its llama.cpp model and a context of its own beside the target's, one KV
stream a running sequence, and one batch decoded at a time, its rows' logits read back.

A draft model's tokens go into the target's batch as they are, so its vocabulary must be the target's:
llama.cpp's rules (common_speculative_are_compatible in common/speculative.cpp) are checked at load, and a
draft that breaks one is refused with a sentence that names both models.
"""

from __future__ import annotations

import ctypes

import llama_cpp as L
import numpy as np

from cllm.core.config import ServeConfig
from cllm.core.model_meta import gpu_layers
from engine_proc.run.batch import Batch
from engine_proc.run.model_runner import ModelLoadError, ModelRunner, context_params

VOCAB_DIFF = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE: most tokens the two vocabularies' sizes may differ by
CHECK_FROM = 5  # SPEC_VOCAB_CHECK_START_TOKEN_ID: token texts are compared from this id on


def incompatible(target, draft) -> str | None:
    """Why the draft vocabulary cannot serve the target's (llama.cpp's rules, in its order), or None."""
    if L.llama_vocab_type(target) != L.llama_vocab_type(draft):
        return f"their tokenizers differ (vocab types {L.llama_vocab_type(target)} and {L.llama_vocab_type(draft)})"
    for name, add, token in (
        ("BOS", L.llama_vocab_get_add_bos, L.llama_vocab_bos),
        ("EOS", L.llama_vocab_get_add_eos, L.llama_vocab_eos),
    ):
        if add(target) != add(draft) or (add(target) and token(target) != token(draft)):
            return f"their {name} tokens differ ({token(target)} and {token(draft)})"
    n_t, n_d = L.llama_vocab_n_tokens(target), L.llama_vocab_n_tokens(draft)
    if abs(n_t - n_d) > VOCAB_DIFF:
        return f"their vocabularies' sizes differ by more than {VOCAB_DIFF} ({n_t} and {n_d} tokens)"
    for i in range(CHECK_FROM, min(n_t, n_d)):
        a, b = L.llama_vocab_get_text(target, i), L.llama_vocab_get_text(draft, i)
        if a != b:
            return f"their token {i} differs ({a!r} and {b!r})"
    return None


class DraftRunner:
    def __init__(self, path: str, target: ModelRunner, config: ServeConfig):
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = gpu_layers(config)
        self.model = L.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise ModelLoadError(f"llama.cpp could not load the draft model {path}")
        vocab = L.llama_model_get_vocab(self.model)
        if (why := incompatible(target.vocab, vocab)) is not None:
            L.llama_model_free(self.model)
            raise ModelLoadError(f"the draft model {path} cannot draft for {target.info.model_path}: {why}")
        self.n_vocab = L.llama_vocab_n_tokens(vocab)
        self.target_vocab = target.n_vocab  # a drafted token must be one of the target's
        self.streams = config.parallel
        self.size = target.token_budget  # rows of a batch
        cparams = context_params(config, self.size, min(self.size, 512), self.streams)
        cparams.n_ctx = target.seq_ctx * self.streams
        cparams.n_outputs_max = self.streams  # a logits row a stream a decode: the compute buffer holds no more
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            L.llama_model_free(self.model)
            raise ModelLoadError(f"llama.cpp could not create a context of {cparams.n_ctx} cells for {path}")
        target.contexts.append(self.ctx)  # it decodes on the engine's threads, as many as they are
        L.llama_set_n_threads(self.ctx, target.threads.n, target.threads.n)
        self.memory = L.llama_get_memory(self.ctx)
        self.batch = Batch(self.size, self.streams)

    def decode(self, n: int, outputs: int) -> np.ndarray:
        """llama_decode of the batch's first ``n`` rows; the logits of its ``outputs`` rows marked for them, in order
        (a view, good until the next decode)."""
        self.batch.decode(self.ctx, n)
        ptr = ctypes.cast(L.llama_get_logits(self.ctx), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(outputs, self.n_vocab))

    def trim(self, stream: int, keep: int) -> None:
        L.llama_memory_seq_rm(self.memory, stream, keep, -1)

    def close(self) -> None:
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)
