"""The OpenAI-compatible API: models, completions, chat completions."""

from __future__ import annotations

from frontend_proc.doors.openai import chat_completions, completions, models
from frontend_proc.http.app import Door

door = Door([*models.operations, *completions.operations, *chat_completions.operations])
