"""Ollama's API."""

from __future__ import annotations

from frontend_proc.doors.ollama import embeddings, generate, manage, models
from frontend_proc.http.app import Door

door = Door([*models.operations, *generate.operations, *embeddings.operations, *manage.operations])
