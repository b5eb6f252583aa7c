"""Errors, answered in the shape of the API the path belongs to: cLLM's, Anthropic's under /v1/messages, OpenAI's under
/v1/, Ollama's under /api/, or llama-server's on its native routes."""

from __future__ import annotations

from typing import Literal

import msgspec
from starlette.responses import Response

from cllm.core.errors import ApiError

_json = msgspec.json.Encoder()


class Error(msgspec.Struct, kw_only=True, omit_defaults=True):
    """cLLM's {"success": false, "error": what went wrong, "message": details}."""

    success: Literal[False]
    error: str
    message: str | None = None


class OpenAIErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(msgspec.Struct):
    """OpenAI's {"error": {"message", "type", "param", "code"}}."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(msgspec.Struct):
    type: str
    message: str


class AnthropicError(msgspec.Struct, kw_only=True):
    """Anthropic's {"type": "error", "error": {"type", "message"}}."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


class OllamaError(msgspec.Struct):
    """Ollama's {"error": "..."}: its clients raise the message with the status."""

    error: str


class LlamaServerErrorDetail(msgspec.Struct):
    code: int  # the HTTP status again
    message: str
    type: str


class LlamaServerError(msgspec.Struct):
    """llama-server's {"error": {"code", "message", "type"}}."""

    error: LlamaServerErrorDetail


# The routes of llama-server's own API (frontend_proc.doors.llama_server): its clients read its error shape.
LLAMA_SERVER_PATHS = frozenset(
    (
        *("/completion", "/completions", "/infill", "/props", "/slots", "/apply-template", "/tokenize", "/detokenize"),
        *("/rerank", "/reranking"),
    )
)
# llama-server's error type per status (its format_error_response).
LLAMA_SERVER_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}

# Anthropic's error type per status; the SDK raises its exception class from the status.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_response(path: str, exc: ApiError) -> Response:
    return json_response(error_body(path, exc), exc.status, exc.headers)


def error_type(path: str) -> type:
    if path.startswith("/v1/messages"):
        return AnthropicError
    if path.startswith("/api/"):
        return OllamaError
    if path in LLAMA_SERVER_PATHS or path.startswith("/slots/"):
        return LlamaServerError
    return OpenAIError if path.startswith("/v1/") else Error


def error_body(path: str, exc: ApiError) -> Error | OpenAIError | AnthropicError | OllamaError | LlamaServerError:
    kind = error_type(path)
    if kind is Error:
        return Error(success=False, error=exc.error, message=exc.message)
    if kind is LlamaServerError:
        message = exc.message or exc.error
        if exc.param and exc.status == 400 and exc.param not in message:
            message = f"{exc.param}: {message}"
        default = "invalid_request_error" if exc.status < 500 else "server_error"
        return LlamaServerError(
            LlamaServerErrorDetail(exc.status, message, LLAMA_SERVER_TYPES.get(exc.status, default))
        )
    if kind is OllamaError:
        message = exc.message or exc.error
        return OllamaError(f"{exc.param}: {message}" if exc.param and exc.status == 400 else message)
    if kind is AnthropicError:
        message = f"{exc.param}: {exc.message}" if exc.param and exc.message else exc.message or exc.error
        default = "invalid_request_error" if exc.status < 500 else "api_error"
        return AnthropicError(error=AnthropicErrorDetail(ANTHROPIC_TYPES.get(exc.status, default), message))
    return OpenAIError(
        OpenAIErrorDetail(
            message=f"{exc.error}: {exc.message}" if exc.message else exc.error,
            type="invalid_request_error" if exc.status < 500 else "server_error",
            param=exc.param,
            code=exc.code or exc.error.replace(" ", "_"),
        )
    )


def json_response(data, status: int = 200, headers: dict | None = None) -> Response:
    return Response(_json.encode(data), status, headers, media_type="application/json")
