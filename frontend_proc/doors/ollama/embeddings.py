"""Ollama's embeddings: POST /api/embed, and /api/embeddings (its older route)."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from frontend_proc.core.embed import embed as vectors_of
from frontend_proc.doors.ollama.loading import keep_alive, loaded_state
from frontend_proc.doors.ollama.models import find
from frontend_proc.doors.ollama.schemas import EmbedBody, EmbeddingsBody
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation


async def embed(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    body = await decode_body(request, EmbedBody)
    model = find(request, body.model)
    st, load_ns = await loaded_state(request, model, keep_alive(body.keep_alive))
    vectors, n_tokens = await vectors_of(st, request, body.input)
    return json_response(
        {
            "model": body.model,
            "embeddings": vectors.tolist(),
            "total_duration": time.perf_counter_ns() - t0,
            "load_duration": load_ns,
            "prompt_eval_count": n_tokens,
        }
    )


async def embeddings(request: Request) -> Response:
    body = await decode_body(request, EmbeddingsBody)
    model = find(request, body.model)
    st, _ = await loaded_state(request, model, keep_alive(body.keep_alive))
    vectors, _ = await vectors_of(st, request, body.prompt)
    return json_response({"embedding": vectors[0].tolist()})


operations = [
    Operation(
        "POST", "/api/embed", embed, "Ollama: embeddings", body=EmbedBody, response=dict, errors=(404, *GENERATE_ERRORS)
    ),
    Operation(
        "POST",
        "/api/embeddings",
        embeddings,
        "Ollama: one embedding (older route)",
        body=EmbeddingsBody,
        response=dict,
        errors=(404, *GENERATE_ERRORS),
    ),
]
