"""The chat page: GET /ui, and GET / for a browser (a request that accepts text/html).

One hand-written HTML file shipped in the package (static/chat.html): no
external asset and no build step. It is a client like any other, calling
/v1/models and /v1/chat/completions with the API key the user types in, so
the page itself is served without one (see guard.py), and its Content
Security Policy lets it reach nothing but this server.
"""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response

PAGE = files("frontend_proc.doors.cllm").joinpath("static/chat.html").read_bytes()
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' "
        "data:"
    ),
    "Cache-Control": "no-cache",
}


def wants_page(accept: str) -> bool:
    """A browser navigating here, not an API client (curl sends */*, SDKs application/json)."""
    return "text/html" in accept


def page(request: Request) -> Response:
    return Response(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)
