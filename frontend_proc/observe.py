"""Watches every HTTP exchange: counts it, and once it ends records and logs its generation.

The route label is the matched route's path template (never the raw URL, so
a scan of unknown paths cannot blow up the label set). Whatever the route
submits to the engine is collected through ``engine_client.submitted``, so a
new route is covered without doing anything.
"""

from __future__ import annotations

import logging
import time

from frontend_proc.engine_client import RequestStream, submitted
from frontend_proc.metrics import Metrics

UNMATCHED = "unmatched"

log = logging.getLogger("cllm.frontend")


class ObserveMiddleware:
    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t_start = time.perf_counter()
        streams: list[RequestStream] = []
        token = submitted.set(streams)
        status = 500  # unless the app starts a response

        async def send_and_note_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            submitted.reset(token)
            t_end = time.perf_counter()
            route = scope.get("route")
            path = route.path if route is not None else UNMATCHED
            self.metrics.request_done(path, status, t_start, t_end, streams)
            if streams:
                log.info("request done", extra={"fields": _fields(scope["method"], path, status, t_start, t_end, streams)})
            elif log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s %d", scope["method"], scope["path"], status, extra={"fields": {"seconds": round(t_end - t_start, 6)}})


def _fields(method: str, route: str, status: int, t_start: float, t_end: float, streams: list[RequestStream]) -> dict:
    firsts = [s.t_first for s in streams if s.t_first is not None]
    return {
        "id": streams[0].request_id,
        "method": method,
        "route": route,
        "status": status,
        "prompt_tokens": sum(s.prompt_tokens for s in streams),
        "generated_tokens": sum(len(s.tokens) for s in streams),
        "ttft": round(min(firsts) - t_start, 6) if firsts else None,
        "total_time": round(t_end - t_start, 6),
        "finish_reason": ",".join(s.finish or "abort" for s in streams),
    }
