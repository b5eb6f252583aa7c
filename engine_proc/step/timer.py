"""Where a step's time goes: the parts the engine marks, summed over steps (for `cllm bench engine`)."""

from __future__ import annotations

import time

# overlapped: host work done while a decode launched ahead runs (LLMEngine._step_ahead), off the step's critical path
PARTS = ("schedule", "batch", "llama_decode", "sampling", "retire", "other", "overlapped")


class StepTimer:
    """Wall and engine-thread CPU seconds of each part of the steps since it was set.

    The engine calls ``start`` when a step begins or resumes and ``lap(part)``
    where a part ends; with no timer set it makes none of these calls. The
    thread's CPU time leaves out llama.cpp's other threads and whatever else
    the machine runs, so it is the steadier figure of the host's own work.
    """

    def __init__(self):
        self.wall = dict.fromkeys(PARTS, 0.0)
        self.cpu = dict.fromkeys(PARTS, 0.0)
        self._wall = self._cpu = 0.0

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.thread_time()

    def lap(self, part: str) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        self.wall[part] += wall - self._wall
        self.cpu[part] += cpu - self._cpu
        self._wall, self._cpu = wall, cpu
