"""Where a step's time goes: the parts the engine marks, summed over steps (for `cllm bench engine`)."""

from __future__ import annotations

import time
from collections.abc import Callable

# overlapped: host work done while a decode launched ahead runs (LLMEngine._step_ahead), off the step's critical path
PARTS = ("schedule", "batch", "llama_decode", "sampling", "retire", "other", "overlapped")


class StepTimer:
    """Wall and engine-thread CPU seconds of each part of the steps since it was set.

    A part runs from where the part before it ended: the engine calls
    ``start`` when a step begins or resumes, and a part ends where its
    ``with timer.part(name)`` block does (or at ``lap(name)``). With no
    timer set the engine's is NO_TIMER, whose marks cost a call and do
    nothing. The thread's CPU time leaves out llama.cpp's other threads and
    whatever else the machine runs, so it is the steadier figure of the
    host's own work.
    """

    def __init__(self):
        self.wall = dict.fromkeys(PARTS, 0.0)
        self.cpu = dict.fromkeys(PARTS, 0.0)
        self._wall = self._cpu = 0.0
        self._parts = {name: _Part(self, name) for name in PARTS}
        # A GPU's llama_decode returns before the device is done: timed, the engine waits for it where the
        # decode's part ends (the engine sets its runner's), else the wait would count as sampling.
        self.synchronize: Callable[[], None] = _nothing

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.thread_time()

    def lap(self, part: str) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        self.wall[part] += wall - self._wall
        self.cpu[part] += cpu - self._cpu
        self._wall, self._cpu = wall, cpu

    def part(self, name: str) -> _Part:
        return self._parts[name]


class _Part:
    """A part's block: it ends the part where it ends."""

    __slots__ = ("timer", "name")

    def __init__(self, timer: StepTimer, name: str):
        self.timer, self.name = timer, name

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        self.timer.lap(self.name)


class _NoTimer:
    """The engine's timer while none is set: every mark does nothing."""

    def start(self) -> None:
        pass

    def lap(self, part: str) -> None:
        pass

    def part(self, name: str) -> _NoPart:
        return _NO_PART

    def synchronize(self) -> None:
        pass


class _NoPart:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


def _nothing() -> None:
    pass


_NO_PART = _NoPart()
NO_TIMER = _NoTimer()
Timer = StepTimer | _NoTimer
