"""ASGI middleware every request passes before any route: the API key and the body size.

A body over the limit is refused from its Content-Length before a byte of it is
read, or, sent in chunks, as soon as the bytes counted pass the limit; either
way the connection is closed rather than drained.
"""

from __future__ import annotations

import hmac

from cllm.core.errors import ApiError

OPEN_PATHS = ("/health", "/ui")  # answered without the API key
PAGE_PATHS = ("/", "/ui")  # the chat page, for a browser: it asks for the key itself


class Guard:
    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app = app
        self.api_key = api_key.encode() if api_key is not None else None
        self.max_body = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            chunked = self._check(scope)
        except ApiError as e:
            return await e.response(scope["path"])(scope, receive, send)
        await self.app(scope, self._counting(receive) if chunked else receive, send)

    def _check(self, scope) -> bool:
        """Pass the key and the declared length; True if the body comes in chunks of unknown total."""
        length = -1
        chunked = False
        authorization = b""
        api_key_header = b""  # Anthropic's clients send x-api-key
        accept = b""
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value)  # the HTTP parser already refused a malformed one
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"authorization":
                authorization = value
            elif name == b"x-api-key":
                api_key_header = value
            elif name == b"accept":
                accept = value
        page = scope["path"] in PAGE_PATHS and b"text/html" in accept
        if self.api_key is not None and scope["path"] not in OPEN_PATHS and not page:
            scheme, _, token = authorization.partition(b" ")
            if scheme.lower() != b"bearer":
                token = api_key_header
            if not hmac.compare_digest(token.strip(), self.api_key):
                raise ApiError(
                    401, "unauthorized", "send the API key as 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                    {"WWW-Authenticate": "Bearer"}, code="invalid_api_key",
                )
        if length > self.max_body:
            raise self._too_large()
        return chunked

    def _counting(self, receive):
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise self._too_large()  # raised in the route that reads the body
            return message

        return counted

    def _too_large(self) -> ApiError:
        return ApiError(413, "request too large", f"the body exceeds {self.max_body} bytes", {"Connection": "close"})
