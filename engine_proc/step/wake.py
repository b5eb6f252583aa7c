"""Whether a step's outputs wake the frontend now, or wait in the ring for the next step's."""

from __future__ import annotations

from engine_proc.sequence import Chunk

# Streams in a step from which their tokens may wait for the next ones, where llama.cpp's threads fill the CPUs
# (docs/internals.md: Streaming); fewer get a token an event.
COALESCE_STREAMS = 4


class Waker:
    def __init__(self, stream_interval: float, cpu_bound: bool):
        self.stream_interval = stream_interval  # seconds (--stream-interval-ms)
        self.coalesce_streams = COALESCE_STREAMS if cpu_bound else float("inf")
        self._woke = 0.0  # when the frontend was last woken

    def wake(self, urgent: bool, decode: list[Chunk], took: float, now: float) -> bool:
        """Whether the frontend wants this step's outputs now: if a request begins (its first token
        times TTFT) or ends (``urgent``), or a token read as it comes (per_step) is in it. With
        coalesce_streams or more of those, they may wait in the ring while the next step, if as
        long as this one (``took``), still ends within the stream interval of the last wake-up."""
        if not urgent:
            streams = sum(c.seq.per_step for c in decode)
            if not streams or (streams >= self.coalesce_streams and now + took - self._woke < self.stream_interval):
                return False
        self._woke = now
        return True
