"""The Starlette application: error handling, body decoding, Server-Sent Events (the state is frontend_proc.core.state).

Every route goes through the same steps, whatever API it belongs to: the
Guard middleware (API key, Host and Origin, body size), ``decode_body`` (content type, UTF-8,
JSON, fields), then frontend_proc.core.generation (limits, the queue bound, the
deadline, a client that hangs up).
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from cllm.core.errors import ApiError, json_response
from frontend_proc.core.state import AppState
from frontend_proc.http import lenient
from frontend_proc.http.guard import OPEN_PATHS, Guard
from frontend_proc.http.observe import ObserveMiddleware
from frontend_proc.http.openapi import Operation, document

T = TypeVar("T")
_json = msgspec.json.Encoder()

# curl's -d sends application/x-www-form-urlencoded, and many clients send no
# type at all: both are read as JSON. Any other type is refused with 415.
JSON_MEDIA_TYPES = ("application/json", "application/x-www-form-urlencoded")


def ok(data) -> Response:
    return json_response({"success": True, "data": data})


def sse(event) -> bytes:
    """One Server-Sent Event carrying JSON."""
    return b"data: " + _json.encode(event) + b"\n\n"


def sse_event(name: str, event) -> bytes:
    """One named Server-Sent Event carrying JSON (Anthropic's and the Responses API's streams)."""
    return b"event: " + name.encode() + b"\ndata: " + _json.encode(event) + b"\n\n"


def sse_response(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _on_api_error(request: Request, exc: ApiError) -> Response:
    return exc.response(request.url.path)


async def _on_http_error(request: Request, exc: HTTPException) -> Response:
    return ApiError(exc.status_code, exc.detail.lower(), f"{request.method} {request.url.path}", exc.headers).response(request.url.path)


# msgspec names the field at fault: "Expected `int` >= 1 - at `$.max_tokens`",
# "Object contains unknown field `bogus`", "... field `role` - at `$.messages[0]`".
_FIELD = re.compile(r"field `([^`]*)`")
_PATH = re.compile(r"at `\$\.?([^`]*)`$")


def _param(message: str) -> str | None:
    field, path = _FIELD.search(message), _PATH.search(message)
    parts = [m.group(1) for m in (path, field) if m and m.group(1)]
    return ".".join(parts) or None


async def decode_body(request: Request, type_: type[T]) -> T:
    _check_content_type(request.headers.get("content-type", ""))
    body = await request.body()
    try:
        return _decode(body, type_)
    except msgspec.ValidationError as e:
        raise ApiError(400, "invalid request", str(e), param=_param(str(e))) from None
    except msgspec.DecodeError as e:
        raise ApiError(400, "invalid JSON", str(e)) from None
    except UnicodeDecodeError:
        raise ApiError(400, "invalid UTF-8", "the body is not valid UTF-8 text") from None


def _decode(body: bytes, type_: type[T]) -> T:
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as e:
        if "got `float`" not in str(e) and "unknown field" not in str(e):
            raise
    # JSON (and JSON Schema) count 2.0 as an integer, msgspec's strict ints do not;
    # and a field no Struct declares is what a newer client adds (lenient.decode drops it).
    return lenient.decode(_integral(msgspec.json.decode(body)), type_)


def _integral(value):
    if type(value) is float and value.is_integer():
        return int(value)
    if type(value) is dict:
        return {k: _integral(v) for k, v in value.items()}
    if type(value) is list:
        return [_integral(v) for v in value]
    return value


def _check_content_type(value: str) -> None:
    media, *params = (part.strip().lower() for part in value.split(";"))
    if media and media not in JSON_MEDIA_TYPES and not media.endswith("+json"):
        raise ApiError(415, "unsupported media type", f"the body must be JSON (Content-Type: application/json), not {media}")
    for param in params:
        if param.startswith("charset=") and param[8:].strip('"') not in ("utf-8", "utf8"):
            raise ApiError(415, "unsupported media type", f"JSON must be UTF-8, not {param[8:]}")


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
        exception_handlers={ApiError: _on_api_error, HTTPException: _on_http_error},
    )
    app.state.cllm = app_state
    return app
