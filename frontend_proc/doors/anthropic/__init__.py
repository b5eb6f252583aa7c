"""Anthropic's Messages API."""

from __future__ import annotations

from frontend_proc.doors.anthropic import messages
from frontend_proc.http.app import Door

door = Door([*messages.operations])
