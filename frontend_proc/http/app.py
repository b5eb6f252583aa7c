"""The Starlette application: its routes, middleware and error handlers, and what a route reads of its state.

Every route goes through the same steps, whatever API it belongs to: the
Guard middleware (API key, Host and Origin, body size), ``decode_body`` (frontend_proc.http.body: content type, UTF-8,
JSON, fields), then frontend_proc.core.generation (limits, the queue bound, the
deadline, a client that hangs up).
"""

from __future__ import annotations

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from frontend_proc.core.state import AppState
from frontend_proc.http.errors import error_response, json_response
from frontend_proc.http.guard import OPEN_PATHS, Guard
from frontend_proc.http.observe import ObserveMiddleware
from frontend_proc.http.openapi import Operation, document


def ok(data) -> Response:
    return json_response({"success": True, "data": data})


async def _on_api_error(request: Request, exc: ApiError) -> Response:
    return error_response(request.url.path, exc)


async def _on_http_error(request: Request, exc: HTTPException) -> Response:
    return error_response(request.url.path, ApiError(exc.status_code, exc.detail.lower(), f"{request.method} {request.url.path}", dict(exc.headers or {})))


def state(request: Request) -> AppState:
    return request.app.state.cllm


async def model_state(request: Request, model: str | None) -> AppState:
    """The state of the model a request names (None: the default), loaded; 404 for an unknown name."""
    return await request.app.state.cllm.pool.state_for(model)


async def _openapi(request: Request) -> Response:
    st = state(request)
    if not st.openapi:
        st.openapi = msgspec.json.encode(
            document("cllm", st.operations, OPEN_PATHS, secured=st.api_key is not None, maxima=st.client.limits.maxima())
        )
    return Response(st.openapi, media_type="application/json")


def build_app(app_state: AppState, lifespan) -> Starlette:
    app_state.operations = [
        *app_state.operations,
        Operation("GET", "/openapi.json", _openapi, "this API as an OpenAPI 3.1 document", response=dict),
    ]
    app = Starlette(
        routes=[op.route() for op in app_state.operations],
        lifespan=lifespan,
        middleware=[
            # Outermost, so that a request the guard refuses is counted too.
            Middleware(ObserveMiddleware, metrics=app_state.metrics),
            Middleware(Guard, api_key=app_state.api_key, config=app_state.config),
        ],
        exception_handlers={ApiError: _on_api_error, HTTPException: _on_http_error},  # type: ignore[dict-item]
    )
    app.state.cllm = app_state
    return app
