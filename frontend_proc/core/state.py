"""What every route reads: one model's state (its engine client, tokenizer, template) and the shared settings.

It imports none of its users (app, generation, model_pool, observe), so
they all depend on it and never on each other through it. The model pool
holds states and each state points back at it; the pool is seen here only
through the little that the routes use of it (Pool).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from cllm.core.config import ServeConfig
from frontend_proc.core.template import ChatTemplate
from frontend_proc.core.tokenizer import Tokenizer
from frontend_proc.doors.responses.store import ResponseStore
from frontend_proc.engine.client import EngineClient
from frontend_proc.engine.metrics import Metrics
from frontend_proc.http.openapi import Operation


class Pool(Protocol):
    """The models served (frontend_proc.core.models.ModelPool), as the routes see them."""

    multi: bool  # a registry: unknown names are 404, models load and unload
    models: list  # of model_pool.Model
    by_name: dict  # every id and alias -> its model_pool.Model

    def find(self, name: str | None): ...  # -> model_pool.Model

    async def state_for(self, name: str | None) -> AppState: ...

    async def load(self, model) -> None: ...

    async def unload(self, model, reason: str) -> None: ...

    def keep(self, model, seconds: float) -> None: ...


@dataclass
class AppState:
    config: ServeConfig
    client: EngineClient
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    metrics: Metrics
    operations: list[Operation]  # every route, and what the OpenAPI document says of it
    api_key: str | None = None
    pool: Pool | None = None  # every model; this state is one model's (the default's, for routes that name none)
    model_id: str = ""  # the registry id of this state's model
    responses: ResponseStore = field(default_factory=ResponseStore)  # stored responses of /v1/responses
    generation: int = 0  # times the frontend was restarted
    started_at: float = field(default_factory=time.monotonic)
    openapi: bytes = b""  # the document, built on first request
