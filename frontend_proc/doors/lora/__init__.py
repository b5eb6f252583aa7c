"""LoRA adapters: llama-server's list and scales, vLLM's run-time load and unload."""

from __future__ import annotations

from frontend_proc.doors.lora import routes
from frontend_proc.http.app import Door

door = Door([*routes.operations])
