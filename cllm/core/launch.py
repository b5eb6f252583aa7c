"""What the supervisor hands each child process (as JSON in argv)."""

from __future__ import annotations

import os
import sys

import msgspec

from cllm.core.config import ServeConfig
from cllm.core.images import MAX_REQUEST_BYTES
from cllm.core.protocol import ModelInfo
from cllm.core.registry import ModelSpec
from cllm.core.ring import RingSpec

REQUEST_RING_BYTES = 8 << 20  # holds hundreds of long prompts
OUTPUT_RING_BYTES = 4 << 20  # holds thousands of steps
EXIT_LOAD_FAILED = 3  # an engine that could not load its model: starting it again would not help
# Models a server with --pulled --allow-pull may add while it serves: each gets rings made at start-up (anonymous
# memory, only touched once used), as the rings of every process are made by the supervisor alone.
PULL_SLOTS = 8


def request_ring_bytes(config: ServeConfig) -> int:
    """The request ring's size for an engine: with a projector, room for a request with the most image bytes
    besides what a text-only engine's holds (a record must fit the ring whole)."""
    return REQUEST_RING_BYTES + (MAX_REQUEST_BYTES + (1 << 20) if config.mmproj else 0)


class EngineRings(msgspec.Struct, frozen=True):
    """One engine's pair of rings; they outlive the engine, which restarts on them."""

    requests: RingSpec  # frontend -> engine
    outputs: RingSpec  # engine -> frontend

    def fds(self) -> tuple[int, ...]:
        return (*self.requests.fds(), *self.outputs.fds())


class ModelSlot(msgspec.Struct, kw_only=True):
    """What the frontend knows of one model: its settings and the rings of each replica."""

    spec: ModelSpec
    rings: list[EngineRings]
    loaded: bool = False  # its engines run (or start) as the frontend starts
    asleep: ModelInfo | None = None  # it sleeps (--sleep-idle-seconds): what its engines said when they last served


class SpareSlot(msgspec.Struct, kw_only=True):
    """Rings for a model pulled while serving (sized for a projector), one pair per replica."""

    index: int
    rings: list[EngineRings]


class Launch(msgspec.Struct, kw_only=True):
    config: ServeConfig  # without the API key, which goes in the frontend's environment
    # An engine's: its model and rings (replica `replica` of model `model_id`).
    model_path: str = ""
    rings: EngineRings | None = None
    model_id: str = ""
    replica: int = 0
    # The frontend's: every model, the default first.
    models: list[ModelSlot] = []
    spare: list[SpareSlot] = []  # with --pulled --allow-pull: rings for the models pulls add
    hub_cache: str = ""  # with --allow-pull: the Hugging Face cache, where the models it may delete are
    # Read end of a pipe only the supervisor writes: EOF means it is gone. The
    # frontend's also carries notices (EngineExited, one JSON line each).
    lifeline: int
    generation: int = 0  # times this child was started before
    listen: int = -1  # the frontend's listening socket, held by the supervisor
    ready: int = -1  # the frontend writes a line here once it serves
    control: int = -1  # the frontend asks for models to be loaded and unloaded here (JSON lines)

    def fds(self) -> tuple[int, ...]:
        rings = (
            [self.rings]
            if self.rings is not None
            else [r for rings in [m.rings for m in self.models] + [s.rings for s in self.spare] for r in rings]
        )
        fds = tuple(fd for r in rings for fd in r.fds()) + (self.lifeline,)
        return fds + tuple(fd for fd in (self.listen, self.ready, self.control) if fd >= 0)

    def argv(self, module: str) -> list[str]:
        return [sys.executable, "-m", module, msgspec.json.encode(self).decode()]


def from_argv() -> Launch:
    return msgspec.json.decode(sys.argv[1], type=Launch)


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
