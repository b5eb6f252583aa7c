"""The frontend process: uvicorn serving the Starlette app, attached to the rings."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import itertools
import logging
import os
import signal
import socket
import sys
from typing import cast

import anyio
import msgspec
import uvicorn
from starlette.applications import Starlette

from cllm.core.config import ServeConfig
from cllm.core.launch import Launch, ModelSlot, from_argv
from cllm.core.log import setup_logging
from cllm.core.protocol import EngineExited, Notice
from cllm.core.registry import is_pool
from frontend_proc.core.pool import ModelPool
from frontend_proc.core.pulls import Pulls
from frontend_proc.core.state import ModelState
from frontend_proc.core.tokenizer import Tokenizer
from frontend_proc.engine.client import EngineClient
from frontend_proc.engine.metrics import Metrics
from frontend_proc.http.app import Door, build_app
from frontend_proc.http.server import ServerState

log = logging.getLogger("cllm.frontend")

# The doors (frontend_proc.doors.<name>), in the order their routes match and GET / lists them. A door is its package,
# which exports a Door, and its name here: nothing else in the process names it.
DOORS = ("cllm", "openai", "embeddings", "rerank", "lora", "llama_server", "anthropic", "responses", "ollama")
_doors: list[Door] = [importlib.import_module(f"frontend_proc.doors.{name}").door for name in DOORS]


class _Server(uvicorn.Server):
    """Tells the supervisor, through the ready pipe, that it serves."""

    def __init__(self, config: uvicorn.Config, ready_fd: int):
        super().__init__(config)
        self._ready_fd = ready_fd

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            log.info("listening on http://%s:%d", host, port)
            os.write(self._ready_fd, b"serving\n")
            os.close(self._ready_fd)


def build(launch: Launch) -> tuple[Starlette, ModelPool]:
    """The Starlette app of a Launch, attached to its rings once its lifespan starts.

    Also run in-process by a Ray Serve replica (cllm/ray_serve), with no uvicorn of its own.
    """
    config = launch.config
    metrics = Metrics()
    ids = itertools.count(1)

    def clients_for(slot: ModelSlot) -> list[EngineClient]:
        return [
            EngineClient(slot.spec.config, rings, metrics, slot.spec.id, r, ids) for r, rings in enumerate(slot.rings)
        ]

    clients = [clients_for(slot) for slot in launch.models]
    default = launch.models[0].spec
    tokenizer = Tokenizer(default.path)
    default_state = ModelState(
        config=config,
        client=clients[0][0],
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template(_read(config.chat_template_file)),
        model_id=default.id,
    )
    pool = ModelPool(
        launch.models, default_state, clients, launch.control, metrics, multi=is_pool(config), clients_for=clients_for
    )
    if len(clients[0]) > 1:
        default_state.client = cast(EngineClient, pool.default.client)  # a ReplicaSet has an EngineClient's face
    srv = ServerState(
        config=config,
        metrics=metrics,
        pool=pool,
        api_key=os.environ.pop("CLLM_API_KEY", None),
        generation=launch.generation,
        pulls=Pulls(config, pool, launch.spare, launch.hub_cache),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loop = asyncio.get_running_loop()
        # Starlette streams through anyio, which imports its asyncio backend
        # on first use: done now, not in the first streamed request's time.
        anyio.get_cancelled_exc_class()
        pool.start()
        loop.add_reader(launch.lifeline, _Lifeline(launch.lifeline, srv).read)
        if pool.default.loading is not None:
            await pool.default.loading
        yield
        loop.remove_reader(launch.lifeline)
        pool.stop()

    app = build_app(srv, default_state, _doors, lifespan)
    return app, pool


def main() -> int:
    launch = from_argv()
    setup_logging(launch.config.log_level, launch.config.log_format)
    config = launch.config
    app, _ = build(launch)
    server = _Server(uvicorn_config(app, config), launch.ready)
    # The supervisor's listening socket: it outlives this process, so clients
    # that connect while a successor starts wait in its backlog.
    server.run(sockets=[socket.socket(fileno=launch.listen)])
    return 0 if server.started else 1


def uvicorn_config(app: Starlette, config: ServeConfig) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools",
        # No route speaks WebSocket: without this uvicorn loads a WebSocket library at every start (~0.05 CPU s).
        ws="none",
        # Our handler, not uvicorn's; its own records only at debug (requests are logged by observe.py).
        log_config=None,
        log_level="debug" if config.log_level == "debug" else "warning",
        access_log=False,
        timeout_graceful_shutdown=config.shutdown_timeout,  # type: ignore[arg-type]  # asyncio takes a float
    )


def _read(path: str | None) -> str | None:
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


_notice = msgspec.json.Decoder(Notice)


class _Lifeline:
    """The supervisor writes notices here, one JSON line each (a pulled model's may take several reads); EOF
    means it died."""

    def __init__(self, fd: int, srv: ServerState):
        self.fd, self.srv, self.buf = fd, srv, b""

    def read(self) -> None:
        data = os.read(self.fd, 1 << 16)
        *lines, self.buf = (self.buf + data).split(b"\n")
        pool, pulls = self.srv.pool, self.srv.pulls
        for line in lines:
            notice = _notice.decode(line)
            if isinstance(notice, EngineExited):
                pool.engine_exited(notice)
            elif pulls is not None:
                pulls.on_notice(notice)
        if data:
            return
        asyncio.get_running_loop().remove_reader(self.fd)
        if pool.default.loading is not None:
            pool.default.loading.cancel()
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown


if __name__ == "__main__":
    sys.exit(main())
