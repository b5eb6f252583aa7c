"""What the process holds for every model: the settings, the metrics, the models, the routes and their document.

One model's state (frontend_proc.core.state.ModelState) is what most routes read; this is for those that answer
for the whole server (health, metrics, the model lists, the OpenAPI document) and for the middleware.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cllm.core.config import ServeConfig
from frontend_proc.core.pool import ModelPool
from frontend_proc.core.pulls import Pulls
from frontend_proc.engine.metrics import Metrics
from frontend_proc.http.openapi import Operation


@dataclass
class ServerState:
    config: ServeConfig
    metrics: Metrics
    pool: ModelPool  # every model; the default's state is the one routes that name none read
    api_key: str | None = None
    generation: int = 0  # times the frontend was restarted
    started_at: float = field(default_factory=time.monotonic)
    operations: list[Operation] = field(default_factory=list)  # every route and what the OpenAPI document says of it
    openapi: bytes = b""  # the document, built on first request
    pulls: Pulls | None = None  # models pulled and deleted over HTTP (frontend_proc/core/pulls.py)
