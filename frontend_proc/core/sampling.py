"""Sampling, whatever the door: the field types every door's schema shares and the checks on what they ask."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from cllm.core.errors import invalid
from cllm.core.protocol import SamplingParams

Seed = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]  # what msgpack carries to the engine
# llama.cpp divides or multiplies logits by it in float32: far from 1 it overflows into NaN probabilities.
RepetitionPenalty = Annotated[float, Meta(ge=0.01, le=100)]


def check_logit_bias(sampling: SamplingParams, n_vocab: int) -> None:
    for token in sampling.logit_bias or ():
        if not 0 <= token < n_vocab:
            raise invalid(f"logit_bias names token {token}, outside the vocabulary (0..{n_vocab - 1})", "logit_bias")
