"""Per-sequence llama.cpp sampler chains.

Each sequence gets its own chain, built once at admission from its
parameters; a step calls llama_sampler_sample once per sampling sequence, so
the work over the vocabulary (penalties, top-k, softmax, the draw) runs in
C and Python's share is O(batch). A chain's seeded distribution belongs to
its sequence alone, so a seed reproduces text whatever else is batched.
"""

from __future__ import annotations

import llama_cpp as L

from cllm.protocol import SamplingParams

PENALTY_LAST_N = 64  # tokens the repetition penalty looks back over, as llama-server


class Sampler:
    def __init__(self, ctx, n_vocab: int, eog_tokens: frozenset[int]):
        self.ctx = ctx
        self.n_vocab = n_vocab
        bias = (L.llama_logit_bias * len(eog_tokens))(*((t, float("-inf")) for t in sorted(eog_tokens)))
        self._no_eog = (len(eog_tokens), bias)

    def chain(self, params: SamplingParams, prompt: list[int]):
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        add = lambda s: L.llama_sampler_chain_add(chain, s)  # noqa: E731
        if params.ignore_eos:  # never end: ban end-of-generation tokens outright
            add(L.llama_sampler_init_logit_bias(self.n_vocab, *self._no_eog))
        if params.repetition_penalty != 1.0:
            penalties = L.llama_sampler_init_penalties(self.n_vocab, PENALTY_LAST_N, params.repetition_penalty, 0.0, 0.0)
            for t in prompt[-PENALTY_LAST_N:]:
                L.llama_sampler_accept(penalties, t)
            add(penalties)
        if params.temperature <= 0:
            add(L.llama_sampler_init_greedy())
            return chain
        if params.top_k > 0:
            add(L.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(L.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(L.llama_sampler_init_min_p(params.min_p, 1))
        add(L.llama_sampler_init_temp(params.temperature))
        seed = L.LLAMA_DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF
        add(L.llama_sampler_init_dist(seed))
        return chain

    def sample(self, chain, row: int) -> int:
        return L.llama_sampler_sample(chain, self.ctx, row)

    @staticmethod
    def free(chain) -> None:
        L.llama_sampler_free(chain)
