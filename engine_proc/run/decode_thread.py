"""llama_decode on a thread of its own, so that the engine's Python runs while llama.cpp computes.

ctypes lets go of the GIL for the length of a llama_decode call, so while
this thread waits in it the engine thread records the tokens of the decode
before, and the engine process writes them to the ring (see
LLMEngine._step_ahead). Two locks hand the decode over and back: the engine
thread releases ``_go`` and later blocks on ``_done``; an idle engine leaves
this thread blocked on ``_go``, so nothing spins.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class DecodeThread:
    def __init__(self, decode: Callable[[], None]):
        self._decode = decode
        self._go = threading.Lock()  # held while there is nothing to decode
        self._done = threading.Lock()  # held until the decode launched ends
        self._go.acquire()
        self._done.acquire()
        self._error: BaseException | None = None
        self._closing = False
        self._thread: threading.Thread | None = None  # started by the first launch

    def launch(self) -> None:
        """Start one decode; wait() ends it. Nothing else may use the llama.cpp context meanwhile."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="llama_decode", daemon=True)
            self._thread.start()
        self._go.release()

    def wait(self) -> None:
        """Until the decode launched ends; its error, if it raised one."""
        self._done.acquire()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            if self._closing:
                return
            try:
                self._decode()
            except BaseException as e:  # handed to the engine thread, which raises it in wait()
                self._error = e
            self._done.release()

    def close(self) -> None:
        """End the thread (no decode may be in flight)."""
        if self._thread is not None:
            self._closing = True
            self._go.release()
            self._thread.join()
            self._thread = None
