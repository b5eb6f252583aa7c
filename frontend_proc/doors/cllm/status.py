"""cLLM's routes about the server: / (this list, or the chat page for a browser), /ui, /health, /metrics."""

from __future__ import annotations

import time
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from cllm.core.protocol import ModelInfo, PrefixCacheStats
from frontend_proc.core.pool import ModelPool
from frontend_proc.doors.cllm import chat_page
from frontend_proc.doors.cllm.schemas import (
    Components,
    Endpoint,
    EngineFigures,
    EngineStatus,
    Health,
    Index,
    Ok,
    PrefixCacheFigures,
    Queue,
    Restarts,
)
from frontend_proc.engine.client import EngineClient
from frontend_proc.engine.metrics import Metrics
from frontend_proc.http.app import json_response, ok, server, state
from frontend_proc.http.openapi import Operation

HEALTH_LEVELS = ("basic", "detailed", "full")


async def index(request: Request) -> Response:
    if chat_page.wants_page(request.headers.get("accept", "")):
        return chat_page.page(request)
    return ok(Index("cllm", [Endpoint(op.method, op.doc_path, op.summary) for op in server(request).operations]))


async def health(request: Request) -> Response:
    st, srv = state(request), server(request)
    pool = srv.pool
    level = request.query_params.get("level", "basic")
    if level not in HEALTH_LEVELS:
        raise ApiError(400, "invalid request", f"level must be basic, detailed or full, not {level!r}")
    client = st.client
    live = [c for m in pool.models if m.status == "loaded" for c in m.clients] if pool.multi else [client]
    if pool.default.status == "sleeping":  # --sleep-idle-seconds: asleep is not down, the next request wakes it
        live = [c for c in live if c not in pool.default.clients]
    healthy = all(c.info is not None for c in live)
    data = Health(
        healthy=healthy,
        status="healthy" if healthy else "restarting" if any(c.ready and c.ready.done() for c in live) else "starting",
        components=Components(frontend=True, tokenizer=True, engine=healthy),
    )
    stats = client.stats
    if level in ("detailed", "full"):
        data.queue = Queue(client.in_flight, stats.running if stats else 0, stats.waiting if stats else 0)
        data.uptime_seconds = round(time.monotonic() - srv.started_at, 3)
        data.restarts = Restarts(engine=client.generation, frontend=srv.generation)
        data.engines = _engines(pool)
        if client.info is not None:
            data.engine = _engine_figures(client, client.info, srv.metrics, full=level == "full")
    if level == "full" and client.info is not None:
        data.model = client.info
        cache = stats.prefix_cache if stats else PrefixCacheStats()
        data.prefix_cache = PrefixCacheFigures(
            st.config.prefix_cache,
            cache.hits,
            cache.misses,
            cache.hit_tokens,
            cache.cells,
            cache.restored,
            cache.host_cells,
            cache.host_bytes,
        )
        data.prefix_cache.disk_hits, data.prefix_cache.disk_entries = cache.disk_hits, cache.disk_entries
        data.prefix_cache.disk_bytes, data.prefix_cache.disk_load_seconds = (
            cache.disk_bytes,
            round(cache.disk_load_seconds, 6),
        )
        data.prefix_cache.disk_rejected = cache.disk_rejected
    return json_response(Ok(data=data), 200 if healthy else 503)


def _engines(pool: ModelPool) -> list[EngineStatus]:
    engines = []
    for model in pool.models:
        for c in model.clients:
            if not c.running:
                continue
            stats = c.stats
            status: Literal["serving", "starting", "restarting"] = (
                "serving" if c.info is not None else "restarting" if c.ready and c.ready.done() else "starting"
            )
            engines.append(
                EngineStatus(
                    model.id,
                    c.replica,
                    status,
                    stats.running if stats else 0,
                    stats.waiting if stats else 0,
                    stats.kv_used if stats else 0,
                    c.info.ctx_size if c.info else 0,
                    c.generation,
                )
            )
    return engines


def _engine_figures(client: EngineClient, info: ModelInfo, metrics: Metrics, full: bool) -> EngineFigures:
    """The engine as of its last EngineStats (at most a second old while busy)."""
    stats = client.stats
    now = time.monotonic()
    kv_used = stats.kv_used if stats else 0
    figures = EngineFigures(
        kv_used=kv_used,
        kv_total=info.ctx_size,
        kv_usage_ratio=round(kv_used / info.ctx_size, 4),
        tokens_per_second_1m=round(metrics.token_rate(now), 2),
        uptime_seconds=round(now - (client.ready_at or now), 3),
    )
    if full:
        figures.steps = stats.steps if stats else 0
        figures.generated_tokens = stats.generated_tokens if stats else 0
        figures.parallel = info.parallel
    return figures


async def metrics(request: Request) -> Response:
    """Prometheus text; `?model=` (llama-server's router's parameter) keeps that model's series. Its figures live
    here in the frontend, so naming a sleeping or unloaded model neither wakes nor loads it."""
    srv = server(request)
    name = request.query_params.get("model")
    model = None if name is None else srv.pool.find(name).id
    return Response(srv.metrics.exposition(model), media_type=srv.metrics.content_type)


operations = [
    Operation(
        "GET",
        "/",
        index,
        "this list; the chat page for a browser (Accept: text/html)",
        response=Ok[Index],
        text="text/html",
    ),
    Operation("GET", "/ui", chat_page.page, "the chat page", text="text/html"),
    Operation(
        "GET",
        "/health",
        health,
        "liveness; ?level=basic|detailed|full",
        response=Ok[Health],
        also=(503,),
        errors=(400,),
        query=(("level", HEALTH_LEVELS),),
    ),
    Operation(
        "GET", "/metrics", metrics, "Prometheus metrics; ?model= one model's series", text="text/plain", errors=(404,)
    ),
]
