"""cLLM's answer to /generate: the whole result, or a StreamEvent per piece and one that says it is done."""

from __future__ import annotations

import time
from typing import Literal, cast

from cllm.core.errors import ApiError
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.doors.cllm.schemas import GenerateResult, StreamEvent
from frontend_proc.http import lifecycle
from frontend_proc.http.sse import sse

Finish = Literal["stop", "length"]  # a choice's finish once it ends (the engine writes it as a string)


def request_id(choice: Choice) -> str:
    return f"cllm-{choice.stream.id}"


def result(gen: Generation, text: str, max_tokens: int) -> GenerateResult:
    choice = gen.choices[0]
    elapsed = time.perf_counter() - choice.stream.t_submit
    return GenerateResult(
        id=request_id(choice),
        text=text,
        response_time=round(elapsed, 6),
        tokens_per_second=round(choice.n_tokens / elapsed, 3) if elapsed > 0 else 0.0,
        generated_tokens=choice.n_tokens,
        prompt_tokens=gen.prompt_tokens,
        max_tokens=max_tokens,
        finish_reason=cast(Finish, choice.finish),
    )


class Stream(lifecycle.Stream):
    """A StreamEvent per piece, then one that says it is done (or what went wrong)."""

    def __init__(self, choice: Choice):
        self.choice, self.rid = choice, request_id(choice)

    def piece(self, choice: Choice, text: str | None) -> bytes:
        return sse(StreamEvent(self.rid, text, False)) if text is not None else b""

    def end(self) -> bytes:
        return sse(
            StreamEvent(
                self.rid,
                "",
                True,
                generated_tokens=self.choice.n_tokens,
                finish_reason=cast(Finish, self.choice.finish),
            )
        )

    def error(self, e: ApiError) -> bytes:
        return sse(StreamEvent(self.rid, "", True, error=e.error, message=e.message))
