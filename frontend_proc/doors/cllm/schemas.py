"""Request and response bodies of cLLM's API; the OpenAPI document is built from them.

Requests are validated by msgspec as they are decoded: a missing, unknown or
ill-typed field fails with a message that names it (e.g. "Expected `int` >= 1
- at `$.max_tokens`").
"""

from __future__ import annotations

from typing import Annotated, Generic, Literal, TypeVar

import msgspec
from msgspec import Meta

from cllm.core.protocol import ModelInfo
from frontend_proc.core.sampling import Sampling

T = TypeVar("T")


class GenerateRequest(Sampling, kw_only=True, forbid_unknown_fields=True):
    prompt: Annotated[str, Meta(min_length=1)]
    max_tokens: Annotated[int, Meta(ge=1)] = 100
    top_p: Annotated[float, Meta(gt=0, le=1)] = 0.9
    top_k: Annotated[int, Meta(ge=0, lt=1 << 31)] = 40  # llama.cpp's int32
    stream: bool = False
    model: str | None = None  # a registry id or alias; None: the default model


class EncodeRequest(msgspec.Struct, forbid_unknown_fields=True):
    text: str


# ---- responses: {"success": true, "data": ...} ---------------------------------


class Ok(msgspec.Struct, Generic[T], kw_only=True):
    success: Literal[True] = True
    data: T


class Endpoint(msgspec.Struct):
    method: str
    path: str
    description: str


class Index(msgspec.Struct):
    service: str
    endpoints: list[Endpoint]


class Components(msgspec.Struct):
    frontend: bool
    tokenizer: bool
    engine: bool


class Queue(msgspec.Struct):
    in_flight: int  # requests the frontend has given the engine
    running: int  # sequences the engine decodes
    waiting: int  # sequences waiting for a slot


class Restarts(msgspec.Struct):
    engine: int
    frontend: int


class EngineFigures(msgspec.Struct, omit_defaults=True):
    """The engine as of its last EngineStats (at most a second old while busy)."""

    kv_used: int
    kv_total: int
    kv_usage_ratio: float
    tokens_per_second_1m: float
    uptime_seconds: float
    steps: int | None = None  # level full
    generated_tokens: int | None = None
    parallel: int | None = None


class PrefixCacheFigures(msgspec.Struct):
    enabled: bool  # off with --no-prefix-cache
    hits: int  # requests that reused cached KV cells
    misses: int
    hit_tokens: int  # prompt tokens not prefilled thanks to the cache
    cells: int  # KV cells the cache holds in KV streams
    restored: int  # hits served from host RAM (--cache-ram)
    host_cells: int  # KV cells the cache holds in host RAM
    host_bytes: int
    disk_hits: int = 0  # hits served from files (--cache-dir)
    disk_entries: int = 0  # entries in files
    disk_bytes: int = 0
    disk_load_seconds: float = 0.0  # spent reading files for hits
    disk_rejected: int = 0  # files dropped as damaged or not of this format (removed, never used)


class EngineStatus(msgspec.Struct):
    """One engine process of a loaded model, as of its last EngineStats."""

    model: str
    replica: int
    status: Literal["serving", "starting", "restarting"]
    running: int
    waiting: int
    kv_used: int
    kv_total: int
    restarts: int


class Health(msgspec.Struct, omit_defaults=True):
    healthy: bool
    status: Literal["healthy", "starting", "restarting"]
    components: Components
    queue: Queue | None = None  # level detailed and full
    uptime_seconds: float | None = None
    restarts: Restarts | None = None
    engine: EngineFigures | None = None
    model: ModelInfo | None = None
    prefix_cache: PrefixCacheFigures | None = None  # level full
    engines: list[EngineStatus] | None = None  # level detailed and full: every engine of every loaded model


class GenerateResult(msgspec.Struct):
    id: str
    text: str
    response_time: float
    tokens_per_second: float
    generated_tokens: int
    prompt_tokens: int
    max_tokens: int
    finish_reason: Literal["stop", "length"]


class StreamEvent(msgspec.Struct, omit_defaults=True):
    """One Server-Sent Event of /generate_stream: a piece of text, then a last one with done."""

    id: str
    token: str
    done: bool
    generated_tokens: int | None = None  # on the last event
    finish_reason: Literal["stop", "length"] | None = None
    error: str | None = None  # the stream ended early (timeout, engine failure): what went wrong
    message: str | None = None


class EncodeResult(msgspec.Struct):
    tokens: list[int]
    length: int
