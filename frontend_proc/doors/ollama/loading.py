"""The model an Ollama request names: loaded, kept or let go as keep_alive says."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import invalid
from frontend_proc.core.pool import Model
from frontend_proc.core.state import ModelState
from frontend_proc.doors.ollama.models import now
from frontend_proc.doors.ollama.schemas import seconds
from frontend_proc.http.app import server
from frontend_proc.http.errors import json_response


def keep_alive(value) -> float | None:
    try:
        return seconds(value)
    except ValueError as e:
        raise invalid(str(e), "keep_alive") from None


async def loaded_state(request: Request, model: Model, keep: float | None) -> tuple[ModelState, int]:
    """The model's state, loaded (and kept as long as keep_alive says), and the nanoseconds its load took."""
    t0 = time.perf_counter_ns()
    pool = server(request).pool
    if keep:
        pool.keep(model, keep)
    st = await pool.state_for(model.id)
    return st, time.perf_counter_ns() - t0


def unloads(request: Request, model: Model, keep: float | None) -> bool:
    """keep_alive 0 lets the model go once the request is answered (only a registry's models load and unload)."""
    return keep == 0 and server(request).pool.multi


async def load_only(request: Request, model: Model, keep: float | None, name: str, chat_route: bool) -> Response:
    """A request with nothing to generate: load the model, or with keep_alive 0 unload it (`ollama stop`)."""
    pool = server(request).pool
    if unloads(request, model, keep):
        if model.status in ("loaded", "loading"):
            await pool.unload(model, "keep-alive")
        reason = "unload"
    else:
        await loaded_state(request, model, keep)
        reason = "load"
    out = {"model": name, "created_at": now(), "done": True, "done_reason": reason}
    out.update({"message": {"role": "assistant", "content": ""}} if chat_route else {"response": ""})
    return json_response(out)
