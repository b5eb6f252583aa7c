"""The Starlette application: its routes, middleware and error handlers, and what a route reads of its state.

Every route goes through the same steps, whatever API it belongs to: the
Guard middleware (API key, Host and Origin, body size), ``decode_body`` (frontend_proc.http.body: content type, UTF-8,
JSON, fields), then frontend_proc.core.generation (limits, the queue bound, the
deadline, a client that hangs up).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from frontend_proc.core.generation import engine_limits
from frontend_proc.core.state import ModelState
from frontend_proc.http.errors import error_response, json_response
from frontend_proc.http.guard import OPEN_PATHS, Guard
from frontend_proc.http.observe import ObserveMiddleware
from frontend_proc.http.openapi import Operation, document
from frontend_proc.http.server import ServerState


@dataclass(frozen=True)
class Door:
    """What a door package (frontend_proc.doors.<api>) exports as `door`: its routes, each with what the OpenAPI
    document says of it, and what it keeps on the app beside them (the Responses API's store)."""

    operations: list[Operation]
    keep: Callable[[Starlette], None] | None = None  # run once on the built app


def ok(data) -> Response:
    return json_response({"success": True, "data": data})


async def _on_api_error(request: Request, exc: ApiError) -> Response:
    return error_response(request.url.path, exc)


async def _on_http_error(request: Request, exc: HTTPException) -> Response:
    return error_response(
        request.url.path,
        ApiError(exc.status_code, exc.detail.lower(), f"{request.method} {request.url.path}", dict(exc.headers or {})),
    )


def state(request: Request) -> ModelState:
    """The default model's state, for a route that names no model."""
    return request.app.state.default


async def model_state(request: Request, model: str | None) -> ModelState:
    """The state of the model a request names (None: the default), loaded; 404 for an unknown name."""
    return await request.app.state.server.pool.state_for(model)


def server(request: Request) -> ServerState:
    """What the process holds for every model, for a route that answers for the whole server."""
    return request.app.state.server


async def _openapi(request: Request) -> Response:
    srv = server(request)
    if not srv.openapi:
        maxima = engine_limits(state(request)).maxima()
        srv.openapi = msgspec.json.encode(
            document("cllm", srv.operations, OPEN_PATHS, secured=srv.api_key is not None, maxima=maxima)
        )
    return Response(srv.openapi, media_type="application/json")


def build_app(srv: ServerState, default: ModelState, doors: list[Door], lifespan) -> Starlette:
    srv.operations = [
        *(op for door in doors for op in door.operations),
        Operation("GET", "/openapi.json", _openapi, "this API as an OpenAPI 3.1 document", response=dict),
    ]
    app = Starlette(
        routes=[op.route() for op in srv.operations],
        lifespan=lifespan,
        middleware=[
            # Outermost, so that a request the guard refuses is counted too.
            Middleware(ObserveMiddleware, metrics=srv.metrics),
            Middleware(Guard, api_key=srv.api_key, config=srv.config, images=srv.pool.takes_images),
        ],
        exception_handlers={ApiError: _on_api_error, HTTPException: _on_http_error},  # type: ignore[dict-item]
    )
    app.state.server, app.state.default = srv, default
    for door in doors:
        if door.keep is not None:
            door.keep(app)
    return app
