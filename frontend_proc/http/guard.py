"""ASGI middleware every request passes before any route: the Host, the Origin, the API key and the body size.

Browsers. A web page may send requests to 127.0.0.1, and through a DNS name
of its own that it rebinds to 127.0.0.1 it may even read the answers (DNS
rebinding, Ollama's CVE-2024-28224). So while the server listens on a loopback
address it answers only requests whose Host names a loopback address,
localhost (or a name under it) or this machine, and --allowed-hosts: others
get 403 on every route but /health. A page of another origin may still send a
form-encoded POST without asking the browser first; such a request, which
carries the page's Origin, gets 403 too unless --allowed-origins lists it.
CORS is off unless --allowed-origins lists origins: then their preflights are
answered and their requests granted, and no other origin's.

A body over the limit is refused from its Content-Length before a byte of it is
read, or, sent in chunks, as soon as the bytes counted pass the limit; either
way the connection is closed rather than drained.

The key a request presents, checked or not, names its scope: the engine's
speculative drafts of one scope come from that scope's earlier answers
only (generation.client_scope, cllm.core.protocol.Submit.scope).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket

from starlette.responses import Response

from cllm.core.config import ServeConfig
from cllm.core.errors import ApiError
from frontend_proc.core.generation import client_scope
from frontend_proc.http.errors import error_response

OPEN_PATHS = ("/health", "/ui")  # answered without the API key
PAGE_PATHS = ("/", "/ui")  # the chat page, for a browser: it asks for the key itself
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # a page of another origin can read nothing they answer without a grant
PREFLIGHT_MAX_AGE = "600"


class Guard:
    def __init__(self, app, api_key: str | None, config: ServeConfig, images: bool):
        self.app = app
        # Several keys, comma-separated, as llama-server's --api-key: one a client, each its own drafts' scope.
        self.api_keys = tuple(k.strip().encode() for k in api_key.split(",") if k.strip()) if api_key else None
        self.max_body = config.body_bytes(images)
        self.hosts = host_names(config) if is_loopback(config.host) else None  # None: any Host
        self.origins = frozenset(o.lower() for o in config.allowed_origins)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])  # the last of a repeated header: those read here come once
        origin = headers.get(b"origin", b"").decode("latin-1").lower()
        granted = origin in self.origins
        try:
            self._check_host(scope, headers)
            if granted and scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
                return await _preflight(origin, headers)(scope, receive, send)
            self._check_origin(scope, headers, origin, granted)
            chunked = self._check(scope, headers)
        except ApiError as e:
            return await error_response(scope["path"], e)(scope, receive, send)
        if granted:
            send = _granting(send, origin)
        token = client_scope.set(scope_of(presented_key(headers)))
        try:
            await self.app(scope, self._counting(receive) if chunked else receive, send)
        finally:
            client_scope.reset(token)

    def _check_host(self, scope, headers: dict) -> None:
        host = headers.get(b"host")
        if self.hosts is None or host is None or scope["path"] == "/health":
            return
        name = host_name(host.decode("latin-1"))
        if not (name in self.hosts or name.endswith(".localhost") or _loopback_address(name)):
            raise ApiError(
                403,
                "forbidden",
                f"this server answers requests to its loopback address, localhost or {socket.gethostname()}, "
                f"not to {name!r} (start it with --allowed-hosts {name} to answer that name)",
            )

    def _check_origin(self, scope, headers: dict, origin: str, granted: bool) -> None:
        """A page of another origin that sends what changes state without a grant (a form's POST) is refused."""
        if not origin or granted or scope["method"] in SAFE_METHODS:
            return
        host = headers.get(b"host", b"").decode("latin-1").lower()
        if origin.partition("://")[2] != host:  # not the chat page of this server itself
            raise ApiError(
                403,
                "forbidden",
                f"requests from web pages of {origin} are not allowed (--allowed-origins lets them in)",
            )

    def _check(self, scope, headers: dict) -> bool:
        """Pass the key and the declared length; True if the body comes in chunks of unknown total."""
        length = int(headers.get(b"content-length", -1))  # the HTTP parser already refused a malformed one
        accept = headers.get(b"accept", b"")
        page = scope["path"] in PAGE_PATHS and b"text/html" in accept
        if self.api_keys is not None and scope["path"] not in OPEN_PATHS and not page:
            key = presented_key(headers)
            if not sum(hmac.compare_digest(key, k) for k in self.api_keys):  # each compared: no early way out
                raise ApiError(
                    401,
                    "unauthorized",
                    "send the API key as 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                    {"WWW-Authenticate": "Bearer"},
                    code="invalid_api_key",
                )
        if length > self.max_body:
            raise self._too_large()
        return b"transfer-encoding" in headers

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


def is_loopback(host: str) -> bool:
    """Whether --host is a loopback address (or localhost): then only this machine's clients, and its browsers, reach
    it."""
    return host.lower().rstrip(".") == "localhost" or _loopback_address(host)


def host_names(config: ServeConfig) -> frozenset[str]:
    """The names a Host header may give besides loopback addresses and names under localhost."""
    return frozenset(
        {"localhost", socket.gethostname().lower(), *(h.lower().rstrip(".") for h in config.allowed_hosts)}
    )


def host_name(host: str) -> str:
    """The name of a Host header, without its port: "[::1]:8080" -> "::1", "LocalHost.:80" -> "localhost"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _loopback_address(name: str) -> bool:
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _preflight(origin: str, headers: dict):
    """The answer to an allowed origin's preflight: what it asked for, granted."""
    return Response(
        status_code=204,
        headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
            "Access-Control-Allow-Headers": headers.get(b"access-control-request-headers", b"").decode("latin-1"),
            "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
            "Vary": "Origin",
        },
    )


def _granting(send, origin: str):
    """``send`` with the CORS grant added to the response's headers."""
    grant = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]

    async def granted(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *grant]}
        return await send(message)

    return granted


def presented_key(headers: dict) -> bytes:
    """The API key a request sends: 'Authorization: Bearer KEY', else x-api-key (Anthropic's clients send it)."""
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() != b"bearer":
        token = headers.get(b"x-api-key", b"")
    return token.strip()


def scope_of(key: bytes) -> int:
    """A key's scope: 63 bits of its hash, never 0, which is the scope of requests without a key."""
    if not key:
        return 0
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1 or 1
