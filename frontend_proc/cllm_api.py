"""cLLM's HTTP API: /, /health, /metrics, /generate, /generate_stream, /encode, /model/info."""

from __future__ import annotations

import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from frontend_proc import generation
from frontend_proc.app import ApiError, AppState, decode_body, json_response, ok, sse, sse_response, state
from frontend_proc.generation import Choice, Generation
from frontend_proc.schemas import EncodeRequest, GenerateRequest

ENDPOINTS = [
    {"method": "GET", "path": "/", "description": "this list"},
    {"method": "GET", "path": "/health", "description": "liveness; ?level=basic|detailed|full"},
    {"method": "GET", "path": "/metrics", "description": "Prometheus metrics"},
    {"method": "POST", "path": "/generate", "description": "generate text (\"stream\": true for SSE)"},
    {"method": "POST", "path": "/generate_stream", "description": "generate text as Server-Sent Events"},
    {"method": "POST", "path": "/encode", "description": "tokenize text"},
    {"method": "GET", "path": "/model/info", "description": "the served model and llama.cpp settings"},
    {"method": "GET", "path": "/v1/models", "description": "OpenAI: the served model"},
    {"method": "POST", "path": "/v1/completions", "description": "OpenAI: text completions"},
    {"method": "POST", "path": "/v1/chat/completions", "description": "OpenAI: chat completions"},
]


async def index(request: Request) -> Response:
    return ok({"service": "cllm", "endpoints": ENDPOINTS})


async def health(request: Request) -> Response:
    st = state(request)
    level = request.query_params.get("level", "basic")
    if level not in ("basic", "detailed", "full"):
        raise ApiError(400, "invalid request", f"level must be basic, detailed or full, not {level!r}")
    client = st.client
    healthy = client.info is not None
    data = {
        "healthy": healthy,
        "status": "healthy" if healthy else "starting",
        "components": {"frontend": True, "tokenizer": True, "engine": healthy},
    }
    if level in ("detailed", "full"):
        stats = client.stats
        data["queue"] = {
            "in_flight": client.in_flight,
            "running": stats.running if stats else 0,
            "waiting": stats.waiting if stats else 0,
        }
        data["uptime_seconds"] = round(time.monotonic() - st.started_at, 3)
        if healthy:
            data["engine"] = _engine_figures(st, full=level == "full")
    if level == "full" and healthy:
        data["model"] = msgspec.to_builtins(client.info)
    return json_response({"success": True, "data": data}, 200 if healthy else 503)


def _request_id(choice: Choice) -> str:
    return f"cllm-{choice.stream.id}"


async def _start(st: AppState, body: GenerateRequest, stream: bool) -> Generation:
    return await generation.start(st, [st.tokenizer.encode(body.prompt)], body.sampling(), stream=stream)


def _engine_figures(st: AppState, full: bool) -> dict:
    """The engine as of its last EngineStats (at most a second old while busy)."""
    client, info, stats = st.client, st.client.info, st.client.stats
    now = time.monotonic()
    kv_used = stats.kv_used if stats else 0
    figures = {
        "kv_used": kv_used,
        "kv_total": info.ctx_size,
        "kv_usage_ratio": round(kv_used / info.ctx_size, 4),
        "tokens_per_second_1m": round(st.metrics.token_rate.rate(now), 2),
        "uptime_seconds": round(now - client.ready_at, 3),
        "restarts": client.restarts,
    }
    if full:
        figures["steps"] = stats.steps if stats else 0
        figures["generated_tokens"] = stats.generated_tokens if stats else 0
        figures["parallel"] = info.parallel
    return figures


async def metrics(request: Request) -> Response:
    metrics = state(request).metrics
    return Response(metrics.exposition(), media_type=metrics.content_type)



async def generate(request: Request) -> Response:
    body = await decode_body(request, GenerateRequest)
    if body.stream:
        return await _stream(request, body)
    st = state(request)
    gen = await _start(st, body, stream=False)
    try:
        [text] = await gen.texts()
    finally:
        gen.close()
    choice = gen.choices[0]
    elapsed = time.perf_counter() - choice.stream.t_submit
    return ok(
        {
            "id": _request_id(choice),
            "text": text,
            "response_time": round(elapsed, 6),
            "tokens_per_second": round(choice.n_tokens / elapsed, 3) if elapsed > 0 else 0.0,
            "generated_tokens": choice.n_tokens,
            "prompt_tokens": gen.prompt_tokens,
            "max_tokens": body.max_tokens,
            "finish_reason": choice.finish,
        }
    )


async def generate_stream(request: Request) -> Response:
    return await _stream(request, await decode_body(request, GenerateRequest))


async def _stream(request: Request, body: GenerateRequest) -> Response:
    gen = await _start(state(request), body, stream=True)
    choice = gen.choices[0]
    rid = _request_id(choice)

    async def events():
        try:
            async for _, piece in gen.pieces():
                if piece is not None:
                    yield sse({"id": rid, "token": piece, "done": False})
            yield sse({"id": rid, "token": "", "done": True, "generated_tokens": choice.n_tokens, "finish_reason": choice.finish})
        finally:
            gen.close()

    return sse_response(events())


async def encode(request: Request) -> Response:
    body = await decode_body(request, EncodeRequest)
    tokens = state(request).tokenizer.encode(body.text)
    return ok({"tokens": tokens, "length": len(tokens)})


async def model_info(request: Request) -> Response:
    info = generation.engine_info(state(request))
    return ok(
        {
            "model_path": info.model_path,
            "model_name": info.model_name,
            "model_family": info.model_family,
            "quantization": info.quantization,
            "vocab_size": info.vocab_size,
            "num_layers": info.num_layers,
            "max_sequence_length": info.seq_ctx,
            "n_ctx_train": info.n_ctx_train,
            "ctx_size": info.ctx_size,
            "parallel": info.parallel,
            "batch_size": info.batch_size,
            "num_threads": info.threads,
            "gpu_layers": info.gpu_layers,
            "use_mmap": info.use_mmap,
        }
    )


routes = [
    Route("/", index, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/generate", generate, methods=["POST"]),
    Route("/generate_stream", generate_stream, methods=["POST"]),
    Route("/encode", encode, methods=["POST"]),
    Route("/model/info", model_info, methods=["GET"]),
]
