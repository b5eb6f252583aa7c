"""llama-server's API: /completion, /infill, its small routes and its router's model routes."""

from __future__ import annotations

from frontend_proc.doors.llama_server import completion, models, routes
from frontend_proc.http.app import Door

door = Door([*routes.operations, *completion.operations, *models.operations])
