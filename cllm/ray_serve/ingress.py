"""The HTTP face of the Ray Serve application: reads a request, and hands it to an engine replica.

Ray Serve's proxy sends every HTTP request here (route prefix "/"). The
ingress reads the body (at most one byte past --max-body-bytes: the replica's
guard answers 413 from that), takes the text the prompt starts with for the
router, and calls the engine deployment through its handle, whose request
router picks the replica. The replica's answer comes back as is: status,
headers, then the body in the chunks the app wrote, so streams stream. A call
whose replica refused it or died before answering (nothing ran) is sent again;
after three tries the client gets cllm's 503.
"""

from __future__ import annotations

import asyncio

from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from cllm.core.errors import RETRY_AFTER, ApiError
from cllm.ray_serve.call import HttpCall, routing_text, text_blocks
from frontend_proc.http.errors import error_response

ATTEMPTS = 3  # a replica that died (or whose engine did) before answering: again, on the one the router picks then
RETRY_DELAY = 0.2


class Ingress:
    def __init__(self, engines: DeploymentHandle, max_body_bytes: int):
        self._engines = engines.options(method_name="call", stream=True)
        self._max_body = max_body_bytes

    async def __call__(self, request: Request) -> Response:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self._max_body:
                break
        scope = request.scope
        # Ray's PrefixCacheAffinityRouter fails on an empty prompt: a request without one is routed by its path.
        prompt = (routing_text(bytes(body)) if request.method == "POST" else "") or f"{scope['method']} {scope['path']}"
        call = HttpCall(
            scope["method"],
            scope["path"],
            scope.get("query_string", b""),
            list(scope["headers"]),
            bytes(body),
            prompt,
            text_blocks(prompt),
        )
        for attempt in range(ATTEMPTS):
            if attempt:
                await asyncio.sleep(RETRY_DELAY * attempt)  # a dying replica is gone by then, and known to be
            replies = self._engines.remote(call)
            try:
                status, headers, first, more = await replies.__anext__()
                break
            except Exception as e:  # Ray's: the replica died before answering (nothing ran), or none could be reached
                failure = e
        else:
            failed = ApiError(
                503,
                "replica unavailable",
                f"no cllm replica could serve the request ({type(failure).__name__}); retry shortly",
                RETRY_AFTER,
            )
            return error_response(call.path, failed)
        response = StreamingResponse(_rest(first, replies), status) if more else Response(first, status)
        response.raw_headers = headers
        return response


async def _rest(first: bytes, replies):
    try:
        if first:
            yield first
        async for chunk in replies:
            yield chunk
    except Exception:
        return  # the replica died mid-stream (its own engine's death is an error event the app already sent)
    finally:
        replies.cancel()  # a client that hung up: the replica's app aborts its request
