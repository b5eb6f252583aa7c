"""Request bodies of cLLM's API, validated by msgspec as they are decoded.

A missing, unknown or ill-typed field fails the decode with a message that
names it (e.g. "Expected `int` >= 1 - at `$.max_tokens`").
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from cllm.protocol import SamplingParams


class GenerateRequest(msgspec.Struct, forbid_unknown_fields=True):
    prompt: str
    max_tokens: Annotated[int, Meta(ge=1)] = 100
    temperature: Annotated[float, Meta(ge=0)] = 0.7
    top_p: Annotated[float, Meta(gt=0, le=1)] = 0.9
    top_k: Annotated[int, Meta(ge=0)] = 40
    min_p: Annotated[float, Meta(ge=0, le=1)] = 0.0
    repetition_penalty: Annotated[float, Meta(gt=0)] = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
        )


class EncodeRequest(msgspec.Struct, forbid_unknown_fields=True):
    text: str
