"""Logging for every cllm process: the stdlib's, to stderr, as text or one JSON object a line.

A record's structured figures go in ``extra={"fields": {...}}``: the text
format appends them as key=value, the JSON format as top-level keys.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone

import msgspec

_encode = msgspec.json.Encoder(enc_hook=str).encode


class TextFormatter(logging.Formatter):
    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = getattr(record, "fields", None)
        return line + "".join(f" {k}={v}" for k, v in fields.items()) if fields else line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", ()))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _encode(entry).decode()


def setup_logging(level: str, fmt: str) -> None:
    """Send every logger of this process to stderr at ``level``, as text or JSON."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.setLevel(level.upper())  # also for loggers that set their own level (uvicorn's)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
