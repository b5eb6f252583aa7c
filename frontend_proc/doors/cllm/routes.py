"""cLLM's HTTP API: /, /health, /metrics, /generate, /generate_stream, /encode, /model/info."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.protocol import ModelInfo
from frontend_proc.core import generation
from frontend_proc.core.generation import Generation
from frontend_proc.doors.cllm.schemas import (
    EncodeRequest,
    EncodeResult,
    GenerateRequest,
    GenerateResult,
    Ok,
    StreamEvent,
)
from frontend_proc.doors.cllm.writer import Stream, result
from frontend_proc.http import lifecycle
from frontend_proc.http.app import model_state, ok, state
from frontend_proc.http.body import decode_body
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation


async def _start(request: Request, body: GenerateRequest, stream: bool) -> Generation:
    st = await model_state(request, body.model)
    return await generation.start(st, [st.tokenizer.encode(body.prompt)], body.params(body.max_tokens), stream=stream)


async def generate(request: Request) -> Response:
    body = await decode_body(request, GenerateRequest)
    if body.stream:
        return await _stream(request, body)
    gen = await _start(request, body, stream=False)
    [text] = await lifecycle.whole(request, gen)
    return ok(result(gen, text, body.max_tokens))


async def generate_stream(request: Request) -> Response:
    return await _stream(request, await decode_body(request, GenerateRequest))


async def _stream(request: Request, body: GenerateRequest) -> Response:
    gen = await _start(request, body, stream=True)
    return lifecycle.stream(gen, Stream(gen.choices[0]))


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
