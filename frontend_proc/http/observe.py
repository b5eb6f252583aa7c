"""Watches every HTTP exchange: counts it, and once it ends records and logs its generation.

The route label is the matched route's path template (never the raw URL, so
a scan of unknown paths cannot blow up the label set). generation.start, the
one way every API generates, puts its Generation in the list this middleware
sets (generation.watched), so a new route is observed without doing anything.
"""

from __future__ import annotations

import logging
import time

from frontend_proc.core.generation import Generation, watched
from frontend_proc.engine.metrics import Metrics

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
        gens: list[Generation] = []
        token = watched.set(gens)
        status = 500  # unless the app starts a response

        async def send_and_note_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            watched.reset(token)
            t_end = time.perf_counter()
            route = scope.get("route")
            path = route.path if route is not None else UNMATCHED
            self.metrics.request_done(path, status, t_start, t_end, gens)
            for gen in gens:
                log.info("request done", extra={"fields": _fields(path, status, t_start, t_end, gen)})
            if not gens and log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "%s %s %d",
                    scope["method"],
                    scope["path"],
                    status,
                    extra={"fields": {"seconds": round(t_end - t_start, 6)}},
                )


def _fields(route: str, status: int, t_start: float, t_end: float, gen: Generation) -> dict:
    firsts = [c.stream.t_first for c in gen.choices if c.stream.t_first is not None]
    return {
        "id": gen.choices[0].stream.id,  # the number in the response's id: cllm-7, chatcmpl-7
        "route": route,
        "status": status,
        "prompt_tokens": gen.prompt_tokens,
        "generated_tokens": gen.completion_tokens,
        "ttft": round(min(firsts) - t_start, 6) if firsts else None,
        "total_time": round(t_end - t_start, 6),
        "finish_reason": ",".join(c.finish or "abort" for c in gen.choices),
    }
