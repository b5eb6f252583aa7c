"""cLLM's own API, and the chat page."""

from __future__ import annotations

from frontend_proc.doors.cllm import routes, status
from frontend_proc.http.app import Door

door = Door([*status.operations, *routes.operations])
