"""OpenAI's Responses API, with the store its responses are kept in for what follows."""

from __future__ import annotations

from starlette.applications import Starlette

from frontend_proc.doors.responses import responses
from frontend_proc.doors.responses.store import ResponseStore
from frontend_proc.http.app import Door


def _keep_store(app: Starlette) -> None:
    """Every model's stored responses, one store for the process (responses.store reads it off the app)."""
    app.state.responses = ResponseStore(app.state.server.metrics.registry)


door = Door([*responses.operations], _keep_store)
