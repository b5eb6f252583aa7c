"""cLLM's HTTP API: /, /health, /metrics, /generate, /generate_stream, /encode, /model/info."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from cllm.core.protocol import ModelInfo, PrefixCacheStats
from frontend_proc.core import generation
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.core.state import AppState
from frontend_proc.doors.cllm import chat_page
from frontend_proc.doors.cllm.schemas import (
    Components,
    EncodeRequest,
    EncodeResult,
    Endpoint,
    EngineFigures,
    EngineStatus,
    GenerateRequest,
    GenerateResult,
    Health,
    Index,
    Ok,
    PrefixCacheFigures,
    Queue,
    Restarts,
    StreamEvent,
)
from frontend_proc.http import lifecycle
from frontend_proc.http.app import json_response, model_state, ok, state
from frontend_proc.http.body import decode_body
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation
from frontend_proc.http.sse import sse

HEALTH_LEVELS = ("basic", "detailed", "full")


async def index(request: Request) -> Response:
    if chat_page.wants_page(request.headers.get("accept", "")):
        return chat_page.page(request)
    return ok(Index("cllm", [Endpoint(op.method, op.doc_path, op.summary) for op in state(request).operations]))


async def health(request: Request) -> Response:
    st = state(request)
    level = request.query_params.get("level", "basic")
    if level not in HEALTH_LEVELS:
        raise ApiError(400, "invalid request", f"level must be basic, detailed or full, not {level!r}")
    client = st.client
    live = [c for m in st.pool.models if m.status == "loaded" for c in m.clients] if st.pool.multi else [client]
    healthy = all(c.info is not None for c in live)
    data = Health(
        healthy=healthy,
        status="healthy" if healthy else "restarting" if any(c.ready.done() for c in live) else "starting",
        components=Components(frontend=True, tokenizer=True, engine=healthy),
    )
    stats = client.stats
    if level in ("detailed", "full"):
        data.queue = Queue(client.in_flight, stats.running if stats else 0, stats.waiting if stats else 0)
        data.uptime_seconds = round(time.monotonic() - st.started_at, 3)
        data.restarts = Restarts(engine=client.generation, frontend=st.generation)
        data.engines = _engines(st)
        if client.info is not None:
            data.engine = _engine_figures(st, full=level == "full")
    if level == "full" and client.info is not None:
        data.model = client.info
        cache = stats.prefix_cache if stats else PrefixCacheStats()
        data.prefix_cache = PrefixCacheFigures(
            st.config.prefix_cache, cache.hits, cache.misses, cache.hit_tokens, cache.cells, cache.restored, cache.host_cells, cache.host_bytes
        )
        data.prefix_cache.disk_hits, data.prefix_cache.disk_entries = cache.disk_hits, cache.disk_entries
        data.prefix_cache.disk_bytes, data.prefix_cache.disk_load_seconds = cache.disk_bytes, round(cache.disk_load_seconds, 6)
        data.prefix_cache.disk_rejected = cache.disk_rejected
    return json_response(Ok(data=data), 200 if healthy else 503)


def _engines(st: AppState) -> list[EngineStatus]:
    engines = []
    for model in st.pool.models:
        for c in model.clients:
            if not c.running:
                continue
            stats = c.stats
            status = "serving" if c.info is not None else "starting" if not c.ready.done() else "restarting"
            engines.append(EngineStatus(
                model.id, c.replica, status, stats.running if stats else 0, stats.waiting if stats else 0,
                stats.kv_used if stats else 0, c.info.ctx_size if c.info else 0, c.generation,
            ))
    return engines


def _request_id(choice: Choice) -> str:
    return f"cllm-{choice.stream.id}"


async def _start(request: Request, body: GenerateRequest, stream: bool) -> Generation:
    st = await model_state(request, body.model)
    return await generation.start(st, [st.tokenizer.encode(body.prompt)], body.params(body.max_tokens), stream=stream)


def _engine_figures(st: AppState, full: bool) -> EngineFigures:
    """The engine as of its last EngineStats (at most a second old while busy)."""
    client, info, stats = st.client, st.client.info, st.client.stats
    now = time.monotonic()
    kv_used = stats.kv_used if stats else 0
    figures = EngineFigures(
        kv_used=kv_used,
        kv_total=info.ctx_size,
        kv_usage_ratio=round(kv_used / info.ctx_size, 4),
        tokens_per_second_1m=round(st.metrics.token_rate(now), 2),
        uptime_seconds=round(now - (client.ready_at or now), 3),
    )
    if full:
        figures.steps = stats.steps if stats else 0
        figures.generated_tokens = stats.generated_tokens if stats else 0
        figures.parallel = info.parallel
    return figures


async def metrics(request: Request) -> Response:
    metrics = state(request).metrics
    return Response(metrics.exposition(), media_type=metrics.content_type)


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
        return sse(StreamEvent(self.rid, "", True, generated_tokens=self.choice.n_tokens, finish_reason=self.choice.finish))

    def error(self, e: ApiError) -> bytes:
        return sse(StreamEvent(self.rid, "", True, error=e.error, message=e.message))


async def encode(request: Request) -> Response:
    body = await decode_body(request, EncodeRequest)
    tokens = state(request).tokenizer.encode(body.text)
    return ok(EncodeResult(tokens=tokens, length=len(tokens)))


async def model_info(request: Request) -> Response:
    return ok(generation.engine_info(state(request)))


operations = [
    Operation("GET", "/", index, "this list; the chat page for a browser (Accept: text/html)", response=Ok[Index], text="text/html"),
    Operation("GET", "/ui", chat_page.page, "the chat page", text="text/html"),
    Operation(
        "GET", "/health", health, "liveness; ?level=basic|detailed|full",
        response=Ok[Health], also=(503,), errors=(400,), query=(("level", HEALTH_LEVELS),),
    ),
    Operation("GET", "/metrics", metrics, "Prometheus metrics", text="text/plain"),
    Operation(
        "POST", "/generate", generate, 'generate text ("stream": true for SSE)',
        body=GenerateRequest, response=Ok[GenerateResult], events=StreamEvent, errors=GENERATE_ERRORS,
    ),
    Operation(
        "POST", "/generate_stream", generate_stream, "generate text as Server-Sent Events",
        body=GenerateRequest, events=StreamEvent, errors=GENERATE_ERRORS,
    ),
    Operation("POST", "/encode", encode, "tokenize text", body=EncodeRequest, response=Ok[EncodeResult]),
    Operation("GET", "/model/info", model_info, "the served model and llama.cpp settings", response=Ok[ModelInfo], errors=(503,)),
]
