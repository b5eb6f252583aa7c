"""The Starlette application: shared state, error shapes, body decoding."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from cllm.config import ServeConfig
from frontend_proc.chat_template import ChatTemplate
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
    chat_template: ChatTemplate
    metrics: Metrics
    started_at: float = field(default_factory=time.monotonic)


class ApiError(Exception):
    """Answered in the shape of the API the path belongs to (see error_body)."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str | None = None,
        headers: dict | None = None,
        param: str | None = None,  # the request field at fault
        code: str | None = None,  # OpenAI's machine-readable code; default: error in snake_case
    ):
        super().__init__(error)
        self.status, self.error, self.message, self.headers = status, error, message, headers
        self.param, self.code = param, code


def json_response(data, status: int = 200, headers: dict | None = None) -> Response:
    return Response(_json.encode(data), status, headers, media_type="application/json")


def ok(data) -> Response:
    return json_response({"success": True, "data": data})


def sse(event) -> bytes:
    """One Server-Sent Event carrying JSON."""
    return b"data: " + _json.encode(event) + b"\n\n"


def sse_response(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def error_body(path: str, exc: ApiError) -> dict:
    """cLLM's {"success": false, "error", "message"}, or OpenAI's {"error": {...}} under /v1/."""
    if path.startswith("/v1/"):
        message = f"{exc.error}: {exc.message}" if exc.message else exc.error
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error" if exc.status < 500 else "server_error",
                "param": exc.param,
                "code": exc.code or exc.error.replace(" ", "_"),
            }
        }
    body = {"success": False, "error": exc.error}
    if exc.message:
        body["message"] = exc.message
    return body


async def _on_api_error(request: Request, exc: ApiError) -> Response:
    return json_response(error_body(request.url.path, exc), exc.status, exc.headers)


async def _on_http_error(request: Request, exc: HTTPException) -> Response:
    return await _on_api_error(request, ApiError(exc.status_code, exc.detail.lower(), f"{request.method} {request.url.path}", exc.headers))


# msgspec names the field at fault: "Expected `int` >= 1 - at `$.max_tokens`",
# "Object contains unknown field `bogus`", "... field `role` - at `$.messages[0]`".
_FIELD = re.compile(r"field `([^`]*)`")
_PATH = re.compile(r"at `\$\.?([^`]*)`$")


def _param(message: str) -> str | None:
    field, path = _FIELD.search(message), _PATH.search(message)
    parts = [m.group(1) for m in (path, field) if m and m.group(1)]
    return ".".join(parts) or None


async def decode_body(request: Request, type_: type[T]) -> T:
    body = await request.body()
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as e:
        raise ApiError(400, "invalid request", str(e), param=_param(str(e))) from None
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
