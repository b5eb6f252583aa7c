"""What one request may ask of the engine, checked before anything reaches it.

Limits known only at run time live here; fixed ones are part of the request
schemas (n <= 128 and at most 4 stop strings for the OpenAI routes), checked
as the body is decoded and published in the OpenAPI document.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from cllm.core.config import ServeConfig
from cllm.core.errors import ApiError
from cllm.core.protocol import ModelInfo, SamplingParams

REST = -1  # max_tokens asking for what the sequence holds: made a number here, once, for every door


@dataclass(frozen=True, slots=True)
class Limits:
    prompt_tokens: int  # a sequence needs one cell left for what it generates
    max_tokens: int  # one sequence's context: no more can ever be generated
    cap: int  # --max-tokens: the most one request generates, whatever it asks; 0: none
    sequences: int  # in flight at once (--parallel + --max-waiting): a request asking more could never run

    @classmethod
    def of(cls, config: ServeConfig, info: ModelInfo) -> Limits:
        most = info.seq_ctx - 1
        return cls(
            prompt_tokens=min(config.max_prompt_tokens or most, most),
            max_tokens=info.seq_ctx,
            cap=config.max_tokens,
            sequences=info.parallel + config.max_waiting,
        )

    def maxima(self) -> dict[str, int]:
        """What the OpenAPI document states, by request field."""
        return {"max_tokens": self.max_tokens, "max_completion_tokens": self.max_tokens}

    def asked(self, max_tokens: int) -> int:
        """The tokens a request asks for: REST is what one sequence holds."""
        return self.max_tokens if max_tokens == REST else max_tokens

    def capped(self, sampling: SamplingParams) -> SamplingParams:
        """``sampling`` asking for a number, at most --max-tokens (0, a prompt scored and nothing generated, stays
        0)."""
        asked = self.asked(sampling.max_tokens)
        if 0 < self.cap < asked:
            asked = self.cap
        return sampling if asked == sampling.max_tokens else msgspec.structs.replace(sampling, max_tokens=asked)

    def check(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        n: int,
        prompt_param: str,
        limit_param: str = "max_tokens",
        image_positions: int = 0,
    ) -> None:
        """limit_param: the field the client set max_tokens with (num_predict, max_output_tokens...), for the 400.
        image_positions: what the (one) prompt's images take besides its tokens."""
        for prompt in prompts:
            if not prompt:
                raise ApiError(400, "invalid request", "prompt is empty", param=prompt_param)
            if (length := len(prompt) + image_positions) > self.prompt_tokens:
                images = f" (its images take {image_positions})" if image_positions else ""
                raise ApiError(
                    400,
                    "prompt too long",
                    f"the prompt is {length} tokens{images}; this server takes at most {self.prompt_tokens}",
                    param=prompt_param,
                    code="context_length_exceeded",
                )
        if max_tokens > self.max_tokens:
            raise ApiError(
                400,
                "invalid request",
                f"{limit_param} {max_tokens} exceeds the context of one sequence ({self.max_tokens})",
                param=limit_param,
            )
        if n * len(prompts) > self.sequences:
            raise ApiError(
                400,
                "invalid request",
                f"{n * len(prompts)} sequences (n x prompts) exceed the {self.sequences} this server takes at once",
                param="n",
            )
