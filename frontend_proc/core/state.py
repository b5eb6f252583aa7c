"""One model's state: what a route serving that model reads (its engine client, tokenizer and chat template, and
the settings the server runs with).

What the process holds for every model (the models, the metrics, the routes) is frontend_proc.http.server's
ServerState; a route reads that only where it answers for the whole server. This module imports none of its
users (generation, chat, the doors), so they all depend on it and never on each other through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cllm.core.config import ServeConfig
from frontend_proc.core.lora import LoraAdapters
from frontend_proc.core.template import ChatTemplate
from frontend_proc.core.tokenizer import Tokenizer
from frontend_proc.engine.client import EngineClient


@dataclass
class ModelState:
    config: ServeConfig  # the server's settings (one object, shared by every model)
    client: EngineClient  # its engine, or its replicas behind one client
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    model_id: str = ""  # the registry id of this state's model
    adapters: LoraAdapters = field(default_factory=lambda: LoraAdapters([]))  # its LoRA adapters (one for its replicas)
    adapter: int | None = None  # the adapter a request's `model` named (frontend_proc/core/lora.py)
