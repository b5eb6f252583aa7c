"""Keep llama.cpp's own logging quiet: errors only, and never per token; or catch what it says during one call."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile

import llama_cpp as L

_GGML_LOG_LEVEL_ERROR = 4
_log = logging.getLogger("llama.cpp")
_caught: list[str] | None = None  # set while capture() runs: the error lines go here instead of the log


def _error(level, text) -> None:
    if level == _GGML_LOG_LEVEL_ERROR:
        message = text.decode(errors="replace").rstrip()
        if message:
            if _caught is not None:
                _caught.append(message)
            else:
                _log.error(message)


@L.llama_log_callback
def _log_errors(level, text, user_data):
    _error(level, text)


def silence_llama_logs() -> None:
    L.llama_log_set(_log_errors, None)


_said: list[str] | None = None  # set while reported() runs: every line llama.cpp logs


@L.llama_log_callback
def _log_all(level, text, user_data):
    if _said is not None:
        _said.append(text.decode(errors="replace"))
    _error(level, text)


@contextlib.contextmanager
def reported():
    """Every line llama.cpp logs during the block, its errors logged as always: what it says it allocates, say.
    Quiet again after it."""
    global _said
    lines: list[str] = []
    _said = lines
    L.llama_log_set(_log_all, None)
    try:
        yield lines
    finally:
        _said = None
        silence_llama_logs()


def silence_mtmd_logs() -> None:
    """The same for libmtmd (loading a projector, encoding images), which logs through a callback of its own."""
    from llama_cpp import mtmd_cpp  # loads libmtmd: only where a projector is used

    mtmd_cpp.mtmd_helper_log_set(_log_errors, None)


@contextlib.contextmanager
def capture():
    """The lines llama.cpp writes during the block, kept instead of shown: its logged errors and what it prints
    to stderr itself (its grammar parser says why a grammar fails there, not through the log).

    For a rare call whose reason a client must see: stderr is the process's, so whatever another thread
    writes there during the block is caught with it.
    """
    global _caught
    lines: list[str] = []
    silence_llama_logs()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as err:
        os.dup2(err.fileno(), 2)
        _caught = lines
        try:
            yield lines
        finally:
            _caught = None
            os.dup2(saved, 2)
            os.close(saved)
            err.seek(0)
            printed = err.read().decode(errors="replace").splitlines()
            lines[:0] = [line for line in printed if line.strip()]
