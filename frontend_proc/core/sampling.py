"""Sampling, whatever the door: one set of fields, one conversion to the engine's SamplingParams.

Every door's schema inherits Sampling: its API's defaults and bounds are declared over the fields it shares
(OpenAI's temperature 1.0 up to 2, Anthropic's up to 1, llama-server's min_p 0.05), a name of its own through
msgspec's rename (llama-server's and Ollama's repeat_penalty), and ``params`` is where every request's
SamplingParams is made. How many tokens to generate is each door's own field (max_tokens,
max_completion_tokens, max_output_tokens, num_predict, n_predict): the door passes the number, REST for "what
the sequence holds", and the name the client sent for the 400 that a number too large gets.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from cllm.core.errors import invalid
from cllm.core.protocol import SamplingParams
from frontend_proc.core.lora import LoraScale
from frontend_proc.engine.limits import REST

__all__ = ["REST", "Penalty", "RepetitionPenalty", "Sampling", "Seed", "check_logit_bias"]

Seed = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]  # what msgpack carries to the engine
# llama.cpp divides or multiplies logits by it in float32: far from 1 it overflows into NaN probabilities.
RepetitionPenalty = Annotated[float, Meta(ge=0.01, le=100)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]


class Sampling(msgspec.Struct, kw_only=True):
    """The sampling fields every door reads, with cLLM's defaults (those of /generate and Ollama's options)."""

    temperature: Annotated[float, Meta(ge=0)] = 0.7  # 0: greedy
    top_p: Annotated[float, Meta(ge=0, le=1)] = 0.9
    # A full-vocabulary draw costs ~8x more per token than top-k 40 (llama-server's default).
    top_k: Annotated[int, Meta(ge=-1, lt=1 << 31)] = 40  # llama.cpp's int32; 0 or -1: off
    min_p: Annotated[float, Meta(ge=0, le=1)] = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    seed: Seed | None = None  # None: a random seed
    ignore_eos: bool = False  # llama-server's extension: exactly the tokens asked for
    speculative: bool = True  # false: no speculative decoding for this request
    # llama-server's: every LoRA adapter's scale for this request, those left out at 0 (frontend_proc/core/lora.py)
    lora: list[LoraScale] | None = None

    def params(
        self,
        max_tokens: int,
        *,
        logit_bias: dict[int, float] | None = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """The engine's parameters (without a grammar: the door or the chat layer adds it).

        max_tokens: REST for what the sequence holds.
        """
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.engine_seed(),
            ignore_eos=self.ignore_eos,
            logit_bias=logit_bias,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            speculative=self.speculative,
            lora=None if self.lora is None else [(x.id, x.scale) for x in self.lora],
        )

    def engine_seed(self) -> int | None:
        """The seed the engine gets (None: a random one); a door whose API gives seeds a meaning of its own says so."""
        return self.seed


def check_logit_bias(sampling: SamplingParams, n_vocab: int) -> None:
    for token in sampling.logit_bias or ():
        if not 0 <= token < n_vocab:
            raise invalid(f"logit_bias names token {token}, outside the vocabulary (0..{n_vocab - 1})", "logit_bias")
