"""Rerank, in llama-server's shape (Jina's and Cohere's fields; TEI's when the body says `texts`)."""

from __future__ import annotations

from frontend_proc.doors.rerank import routes
from frontend_proc.http.app import Door

door = Door([*routes.operations])
