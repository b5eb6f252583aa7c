"""Errors, answered in the shape of the API the path belongs to: cLLM's, or OpenAI's under /v1/."""

from __future__ import annotations

from typing import Literal

import msgspec
from starlette.responses import Response

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


class ApiError(Exception):
    """Raised anywhere a request is handled; answered with ``status`` (see error_body)."""

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

    def response(self, path: str) -> Response:
        return json_response(error_body(path, self), self.status, self.headers)


def error_type(path: str) -> type:
    return OpenAIError if path.startswith("/v1/") else Error


def error_body(path: str, exc: ApiError) -> Error | OpenAIError:
    if error_type(path) is Error:
        return Error(success=False, error=exc.error, message=exc.message)
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
