"""cLLM's HTTP API: /, /health, /metrics, /generate, /generate_stream, /encode, /model/info."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from cllm.core.protocol import ModelInfo
from frontend_proc.core import generation
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.doors.cllm.schemas import (
    EncodeRequest,
    EncodeResult,
    GenerateRequest,
    GenerateResult,
    Ok,
    StreamEvent,
)
from frontend_proc.http import lifecycle
from frontend_proc.http.app import model_state, ok, state
from frontend_proc.http.body import decode_body
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation
from frontend_proc.http.sse import sse


def _request_id(choice: Choice) -> str:
    return f"cllm-{choice.stream.id}"


async def _start(request: Request, body: GenerateRequest, stream: bool) -> Generation:
    st = await model_state(request, body.model)
    return await generation.start(st, [st.tokenizer.encode(body.prompt)], body.params(body.max_tokens), stream=stream)


async def generate(request: Request) -> Response:
    body = await decode_body(request, GenerateRequest)
    if body.stream:
        return await _stream(request, body)
    gen = await _start(request, body, stream=False)
    [text] = await lifecycle.whole(request, gen)
    choice = gen.choices[0]
    elapsed = time.perf_counter() - choice.stream.t_submit
    return ok(
        GenerateResult(
            id=_request_id(choice),
            text=text,
            response_time=round(elapsed, 6),
            tokens_per_second=round(choice.n_tokens / elapsed, 3) if elapsed > 0 else 0.0,
            generated_tokens=choice.n_tokens,
            prompt_tokens=gen.prompt_tokens,
            max_tokens=body.max_tokens,
            finish_reason=choice.finish,
        )
    )


async def generate_stream(request: Request) -> Response:
    return await _stream(request, await decode_body(request, GenerateRequest))


async def _stream(request: Request, body: GenerateRequest) -> Response:
    gen = await _start(request, body, stream=True)
    return lifecycle.stream(gen, _Stream(gen.choices[0]))


class _Stream(lifecycle.Stream):
    """A StreamEvent per piece, then one that says it is done (or what went wrong)."""

    def __init__(self, choice: Choice):
        self.choice, self.rid = choice, _request_id(choice)

    def piece(self, choice: Choice, text: str | None) -> bytes:
        return sse(StreamEvent(self.rid, text, False)) if text is not None else b""

    def end(self) -> bytes:
        return sse(
            StreamEvent(self.rid, "", True, generated_tokens=self.choice.n_tokens, finish_reason=self.choice.finish)
        )

    def error(self, e: ApiError) -> bytes:
        return sse(StreamEvent(self.rid, "", True, error=e.error, message=e.message))


async def encode(request: Request) -> Response:
    body = await decode_body(request, EncodeRequest)
    tokens = state(request).tokenizer.encode(body.text)
    return ok(EncodeResult(tokens=tokens, length=len(tokens)))


async def model_info(request: Request) -> Response:
    return ok(generation.engine_info(state(request)))


operations = [
    Operation(
        "POST",
        "/generate",
        generate,
        'generate text ("stream": true for SSE)',
        body=GenerateRequest,
        response=Ok[GenerateResult],
        events=StreamEvent,
        errors=GENERATE_ERRORS,
    ),
    Operation(
        "POST",
        "/generate_stream",
        generate_stream,
        "generate text as Server-Sent Events",
        body=GenerateRequest,
        events=StreamEvent,
        errors=GENERATE_ERRORS,
    ),
    Operation("POST", "/encode", encode, "tokenize text", body=EncodeRequest, response=Ok[EncodeResult]),
    Operation(
        "GET",
        "/model/info",
        model_info,
        "the served model and llama.cpp settings",
        response=Ok[ModelInfo],
        errors=(503,),
    ),
]
