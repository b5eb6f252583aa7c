"""Keep llama.cpp's own logging quiet: errors only, and never per token."""

from __future__ import annotations

import logging

import llama_cpp as L

_GGML_LOG_LEVEL_ERROR = 4
_log = logging.getLogger("llama.cpp")


@L.llama_log_callback
def _log_errors(level, text, user_data):
    if level == _GGML_LOG_LEVEL_ERROR:
        message = text.decode(errors="replace").rstrip()
        if message:
            _log.error(message)


def silence_llama_logs() -> None:
    L.llama_log_set(_log_errors, None)
