"""Server-Sent Events carrying JSON, and the streaming response that sends them."""

from __future__ import annotations

import msgspec
from starlette.responses import StreamingResponse

_json = msgspec.json.Encoder()

# A comment line: it keeps a waiting stream's connection alive, and SSE parsers (SDKs, benchmark harnesses) skip
# it, where a data event would be read as the first response.
KEEP_ALIVE = b": ping\n\n"


def sse(event) -> bytes:
    """One Server-Sent Event carrying JSON."""
    return b"data: " + _json.encode(event) + b"\n\n"


def sse_event(name: str, event) -> bytes:
    """One named Server-Sent Event carrying JSON (Anthropic's and the Responses API's streams)."""
    return b"event: " + name.encode() + b"\ndata: " + _json.encode(event) + b"\n\n"


def sse_response(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
