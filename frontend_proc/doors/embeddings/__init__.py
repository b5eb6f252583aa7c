"""Embeddings, in OpenAI's and llama-server's shapes."""

from __future__ import annotations

from frontend_proc.doors.embeddings import routes
from frontend_proc.http.app import Door

door = Door([*routes.operations])
