"""The Starlette application: shared state, error shape, body decoding."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from cllm.config import ServeConfig
from frontend_proc.engine_client import EngineClient
from frontend_proc.metrics import Metrics
from frontend_proc.observe import ObserveMiddleware
from frontend_proc.tokenizer import Tokenizer

T = TypeVar("T")
_json = msgspec.json.Encoder()


@dataclass
class AppState:
    config: ServeConfig
    client: EngineClient
    tokenizer: Tokenizer
    metrics: Metrics
    started_at: float = field(default_factory=time.monotonic)


class ApiError(Exception):
    """Answered as {"success": false, "error": ..., "message": ...}."""

    def __init__(self, status: int, error: str, message: str | None = None, headers: dict | None = None):
        super().__init__(error)
        self.status, self.error, self.message, self.headers = status, error, message, headers


def json_response(data, status: int = 200, headers: dict | None = None) -> Response:
    return Response(_json.encode(data), status, headers, media_type="application/json")


def ok(data) -> Response:
    return json_response({"success": True, "data": data})


def _error_body(status: int, error: str, message: str | None) -> dict:
    body = {"success": False, "error": error}
    if message:
        body["message"] = message
    return body


async def _on_api_error(request: Request, exc: ApiError) -> Response:
    return json_response(_error_body(exc.status, exc.error, exc.message), exc.status, exc.headers)


async def _on_http_error(request: Request, exc: HTTPException) -> Response:
    message = f"{request.method} {request.url.path}"
    return json_response(_error_body(exc.status_code, exc.detail.lower(), message), exc.status_code, exc.headers)


async def decode_body(request: Request, type_: type[T]) -> T:
    body = await request.body()
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as e:
        raise ApiError(400, "invalid request", str(e)) from None
    except msgspec.DecodeError as e:
        raise ApiError(400, "invalid JSON", str(e)) from None


def state(request: Request) -> AppState:
    return request.app.state.cllm


def build_app(app_state: AppState, routes: list, lifespan) -> Starlette:
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(ObserveMiddleware, metrics=app_state.metrics)],
        exception_handlers={ApiError: _on_api_error, HTTPException: _on_http_error},
    )
    app.state.cllm = app_state
    return app
