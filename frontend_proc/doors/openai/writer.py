"""What OpenAI's chat completions and completions share: the response head, usage, the output format, and the
answer whole or as SSE chunks ending with `data: [DONE]` (respond_openai, on frontend_proc.http.lifecycle).
Errors in a stream take OpenAI's shape (frontend_proc.http.errors)."""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError, invalid
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.core.output import GrammarOutput, JsonOutput
from frontend_proc.core.state import ModelState
from frontend_proc.doors.openai.schemas import JsonObjectFormat, JsonSchemaFormat, OpenAIRequest, TextFormat
from frontend_proc.http import lifecycle
from frontend_proc.http.errors import error_body, json_response
from frontend_proc.http.sse import sse

DONE = b"data: [DONE]\n\n"


def output(body: OpenAIRequest) -> JsonOutput | GrammarOutput | None:
    fmt = body.response_format
    if body.grammar:  # an empty one is none, as llama-server reads it
        if fmt is not None and type(fmt) is not TextFormat:
            raise invalid("grammar cannot be combined with a JSON response_format", "grammar")
        return GrammarOutput(body.grammar)
    if type(fmt) is JsonSchemaFormat:
        return JsonOutput(fmt.json_schema.schema)
    return JsonOutput() if type(fmt) is JsonObjectFormat else None


def usage(gen: Generation) -> dict:
    return {
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": gen.cached_tokens},
    }


class _Stream(lifecycle.Stream):
    """OpenAI's chunks: delta(choice, text, start, end) makes those of a piece, from the tokens [start, end)
    consumed since the last (text None: the end of the choice); opening(choice), what a choice opens with before
    its first token (the completions' echoed prompt)."""

    def __init__(self, gen: Generation, head: dict, body: OpenAIRequest, delta: Callable, opening: Callable | None):
        self.gen, self.head, self.body, self.delta, self.opening = gen, head, body, delta, opening
        self.usage_field = {"usage": None} if body.include_usage else {}
        self.sent = [0] * len(gen.choices)

    def start(self) -> bytes:
        if self.opening is None:
            return b""
        return sse({**self.head, "choices": [self.opening(c) for c in self.gen.choices], **self.usage_field})

    def piece(self, choice: Choice, text: str | None) -> bytes:
        start, self.sent[choice.index] = self.sent[choice.index], choice.n_tokens
        head, usage_field = self.head, self.usage_field
        return b"".join(
            [sse({**head, "choices": [c], **usage_field}) for c in self.delta(choice, text, start, choice.n_tokens)]
        )

    def end(self) -> bytes:
        last = sse({**self.head, "choices": [], "usage": usage(self.gen)}) if self.body.include_usage else b""
        return last + DONE

    def error(self, e: ApiError) -> bytes:
        return sse(error_body("/v1/", e))


async def respond_openai(
    request: Request, gen: Generation, head: dict, body: OpenAIRequest, whole: Callable, delta: Callable, opening=None
) -> Response:
    """The whole response (whole(choice, text): one of its choices), or the stream of chunks."""
    if body.stream:
        return lifecycle.stream(gen, _Stream(gen, head, body, delta, opening))
    texts = await lifecycle.whole(request, gen)
    choices = [whole(c, text) for c, text in zip(gen.choices, texts)]
    return json_response({**head, "choices": choices, "usage": usage(gen)})


def response_head(gen: Generation, prefix: str, obj: str, st: ModelState) -> dict:
    return {
        "id": f"{prefix}-{gen.choices[0].stream.id}",
        "object": obj,
        "created": int(time.time()),
        "model": st.model_id,
    }
