"""What the supervisor hands each child process (as JSON in argv)."""

from __future__ import annotations

import os
import sys

import msgspec

from cllm.config import ServeConfig
from cllm.ring import RingSpec

REQUEST_RING_BYTES = 8 << 20  # holds hundreds of long prompts
OUTPUT_RING_BYTES = 4 << 20  # holds thousands of steps


class Launch(msgspec.Struct, kw_only=True):
    config: ServeConfig  # without the API key, which goes in the frontend's environment
    model_path: str
    requests: RingSpec  # frontend -> engine
    outputs: RingSpec  # engine -> frontend
    # Read end of a pipe only the supervisor writes: EOF means it is gone. The
    # frontend's also carries notices (EngineExited, one JSON line each).
    lifeline: int
    generation: int = 0  # times this child was started before
    listen: int = -1  # the frontend's listening socket, held by the supervisor
    ready: int = -1  # the frontend writes a line here once it serves

    def fds(self) -> tuple[int, ...]:
        fds = (*self.requests.fds(), *self.outputs.fds(), self.lifeline)
        return fds + tuple(fd for fd in (self.listen, self.ready) if fd >= 0)

    def argv(self, module: str) -> list[str]:
        return [sys.executable, "-m", module, msgspec.json.encode(self).decode()]


def from_argv() -> Launch:
    return msgspec.json.decode(sys.argv[1], type=Launch)


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
