"""The error every layer raises while a request is handled: a status, a reason and the field at fault.

Framework-free: how each API writes it back (its shape, chosen by the path) is frontend_proc.http.errors.
"""

from __future__ import annotations

# Sent with every 503 a client should simply retry.
RETRY_AFTER = {"Retry-After": "1"}


class ApiError(Exception):
    """Raised anywhere a request is handled; answered with ``status`` (frontend_proc.http.errors)."""

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


def invalid(message: str, param: str) -> ApiError:
    """A 400 naming the request field at fault."""
    return ApiError(400, "invalid request", message, param=param)
