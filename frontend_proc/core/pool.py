"""The models the frontend serves: which is loaded, loading them on demand, unloading idle ones.

Every model of the registry has its engines' rings from the frontend's launch;
loading one means saying Hello on them and asking the supervisor (a line on the
control pipe) to start its engines, then waiting (bounded) for each to answer.
Unloading asks the supervisor to stop them; the model counts as unloaded once
it reports every process gone, so a later load never races the old engines.
With one model (a `cllm serve` with no registry), nothing of this runs per request: the
default model is loaded at start and any model name is taken as it.

Each model has its own ModelState (its client, tokenizer and chat template on
the shared settings), so the routes need one lookup and nothing else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any, cast

import msgspec

from cllm.core.errors import RETRY_AFTER, ApiError
from cllm.core.launch import ModelSlot
from cllm.core.model_file import model_bytes
from cllm.core.model_meta import gpu_layers, kv_cache_bytes
from cllm.core.protocol import Control, EngineExited, LoadModel, ModelInfo, UnloadModel
from frontend_proc.core.lora import Adapter, LoraAdapters
from frontend_proc.core.state import ModelState
from frontend_proc.core.tokenizer import Tokenizer
from frontend_proc.engine.client import EngineClient
from frontend_proc.engine.metrics import Metrics
from frontend_proc.engine.replicas import ReplicaSet

UNLOAD_WAIT = 15.0  # seconds for the supervisor to report a model's engines gone (it kills them after 5)
MIB = 1 << 20

log = logging.getLogger("cllm.frontend")


class Model:
    """One registry model as the frontend sees it."""

    def __init__(self, slot: ModelSlot, clients: list[EngineClient], metrics: Metrics | None = None):
        self.spec = slot.spec
        self.id = slot.spec.id
        self.clients = clients
        self.client: EngineClient | ReplicaSet = clients[0] if len(clients) == 1 else ReplicaSet(clients)
        self.state: ModelState | None = None  # once its tokenizer is loaded
        count = None if metrics is None else lambda name: metrics.lora_requests.labels(self.id, name).inc()
        self.adapters = LoraAdapters(slot.spec.config.lora_files, count)
        self.status = "unloaded"  # loading, loaded, unloading, failed
        self.error = ""  # why the last load failed
        self.last_used = time.monotonic()
        self.unloading_since = 0.0
        self.kept: float | None = None  # seconds idle before unloading, as the last request asked (Ollama's keep_alive)
        self.loading: asyncio.Task | None = None
        self.asleep = False  # stopped for being idle (--sleep-idle-seconds): the next request wakes it
        self.info: ModelInfo | None = None  # what its engines said when they last served: /props answers it asleep
        self.stopped = asyncio.Event()  # every engine process is gone
        self.stopped.set()

    @property
    def keep_alive(self) -> float:
        """Seconds idle before the model is unloaded; 0: never."""
        return self.spec.config.keep_alive if self.kept is None else self.kept

    @property
    def sleep_after(self) -> float:
        """Seconds idle before the model sleeps; 0: never."""
        return self.spec.config.sleep_idle_seconds

    def idle(self) -> bool:
        return self.client.in_flight == 0


class ModelPool:
    def __init__(
        self,
        slots: list[ModelSlot],
        default: ModelState,
        clients: list[list[EngineClient]],
        control_fd: int,
        metrics: Metrics,
        multi: bool,
        clients_for: Callable[[ModelSlot], list[EngineClient]] | None = None,
    ):
        self.models = [Model(slot, c, metrics) for slot, c in zip(slots, clients)]
        self.default = self.models[0]
        self.default.state = default
        default.adapters = self.default.adapters
        self.multi = multi  # a registry: unknown names are 404, models load and unload
        self.by_name = {name: m for m in self.models for name in (m.id, *m.spec.aliases)}
        self._expiring: asyncio.Task | None = None  # the keep-alive watch, once a model has one
        self.metrics = metrics
        self._config = default.config
        self._control = control_fd
        self._slots = slots
        self._clients_for = clients_for  # a model that joins while serving (a pull) gets its clients from here
        self._tasks: set[asyncio.Task] = set()

    @property
    def takes_images(self) -> bool:
        """A model has a projector: request bodies may carry its images."""
        return any(m.spec.config.mmproj for m in self.models)

    def start(self) -> None:
        """Attach to every ring; say Hello to the engines that run; watch keep-alive."""
        for model, slot in zip(self.models, self._slots):
            for client in model.clients:
                client.start(running=slot.loaded)
            if slot.loaded:
                model.stopped.clear()
                model.status = "loading"
                model.loading = self._spawn(
                    self._await_ready(model, None)
                )  # started by the supervisor: no duration to measure
            elif slot.asleep is not None or (model.sleep_after and not self.multi):  # asleep before this frontend
                model.status, model.asleep, model.info = "sleeping", True, slot.asleep
        if (self.multi and any(m.keep_alive for m in self.models)) or any(m.sleep_after for m in self.models):
            self._expiring = self._spawn(self._expire())

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for model in self.models:
            for client in model.clients:
                client.stop()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def add(self, slot: ModelSlot) -> Model:
        """A model that joins while serving (pulled): attached to its rings, unloaded until asked for."""
        assert self._clients_for is not None
        model = Model(slot, self._clients_for(slot), self.metrics)
        for client in model.clients:
            client.start(running=False)
        self.models.append(model)
        self._slots.append(slot)
        self.by_name.update({name: model for name in (model.id, *model.spec.aliases)})
        return model

    def remove(self, model: Model) -> None:
        """A model that leaves while serving (deleted), its engines gone."""
        for client in model.clients:
            client.stop()
        index = self.models.index(model)
        del self.models[index], self._slots[index]
        self.by_name = {name: m for name, m in self.by_name.items() if m is not model}

    # ---- the routes' lookup --------------------------------------------------

    def find(self, name: str | None) -> Model:
        if name is None or not self.multi:
            return self.default  # one model: any name is answered by it, as llama-server does
        model = self.by_name.get(name)
        if model is None:
            raise ApiError(
                404, "model not found", f"the model `{name}` does not exist", param="model", code="model_not_found"
            )
        return model

    def find_adapter(self, name: str | None) -> tuple[Model, Adapter | None]:
        """The model a request's `model` names, and the LoRA adapter it names with it, vLLM's way: `base:adapter`,
        or an adapter's name alone (a model's own name wins)."""
        if name is None or (self.multi and name in self.by_name):
            return self.find(name), None
        base, _, tail = name.rpartition(":")
        if base and (self.multi and base in self.by_name or not self.multi):
            model = self.find(base)
            adapter = model.adapters.by_name(tail)
            if adapter is not None:
                return model, adapter
        for model in self.models if self.multi else [self.default]:
            adapter = model.adapters.by_name(name)
            if adapter is not None:
                return model, adapter
        return self.find(name), None

    async def state_for(self, name: str | None) -> ModelState:
        """The state of the model a request names (absent: the default), loading it if need be; with the LoRA
        adapter it names, if any (find_adapter)."""
        model, adapter = self.find_adapter(name) if name is not None else (self.default, None)
        model.last_used = time.monotonic()
        if model.status != "loaded" and (self.multi or model.asleep):
            await self.load(model)
            model.last_used = time.monotonic()  # idle from when it serves: a slow load must not eat its keep-alive
        assert model.state is not None  # made by its first load
        return model.state if adapter is None else dataclasses.replace(model.state, adapter=adapter.id)

    # ---- loading -------------------------------------------------------------

    async def load(self, model: Model) -> None:
        """Load the model (or join its load in progress); 503 with Retry-After if it does not serve in time."""
        if model.status == "loaded":
            return
        if model.loading is None:
            model.loading = self._spawn(self._load(model))
        try:
            await asyncio.wait_for(asyncio.shield(model.loading), self._config.load_timeout)
        except asyncio.TimeoutError:
            raise ApiError(
                503, "model loading", f"the model `{model.id}` is still loading; retry shortly", RETRY_AFTER
            ) from None

    async def _load(self, model: Model) -> None:
        t0 = time.monotonic()
        try:
            if model.status == "unloading":
                await self._stopped(model)
            state = model.state
            if state is None:
                tokenizer = await asyncio.to_thread(Tokenizer, model.spec.path)
                # A ReplicaSet has an EngineClient's face: the state holds either.
                state = model.state = ModelState(
                    self._config,
                    cast(EngineClient, model.client),
                    tokenizer,
                    tokenizer.chat_template(),
                    model.id,
                    model.adapters,
                )
            self._check_memory(model, state.tokenizer)
            await self._make_room(model)
            model.status, model.error = "loading", ""
            model.stopped.clear()
            for client in model.clients:
                client.hello()
            self.send(LoadModel(model.id))
            log.info(
                "loading model %s", model.id, extra={"fields": {"model": model.id, "replicas": len(model.clients)}}
            )
        except BaseException:
            model.loading = None
            raise
        await self._await_ready(model, t0)

    async def _await_ready(self, model: Model, t0: float | None) -> None:
        try:
            readies = [c.ready for c in model.clients if c.ready is not None]  # hello() made each one's
            await asyncio.wait_for(asyncio.gather(*readies), self._config.load_timeout)
        except (ApiError, asyncio.TimeoutError) as e:
            error = (
                e
                if isinstance(e, ApiError)
                else ApiError(
                    503,
                    "model unavailable",
                    f"the model `{model.id}` did not start within {self._config.load_timeout:g} s",
                    RETRY_AFTER,
                )
            )
            model.error = error.message or ""
            model.loading = None
            self.metrics.loads.labels(model.id, "failed").inc()
            log.error("model %s failed to load: %s", model.id, error.message)
            if model.status == "loading":
                self._request_unload(model, "failed")
            raise error from None
        model.loading = None
        model.status = "loaded"
        model.info = model.client.info
        self.metrics.loads.labels(model.id, "ok").inc()
        if t0 is None:
            return
        seconds = time.monotonic() - t0
        self.metrics.load_seconds.labels(model.id).observe(seconds)
        if model.asleep:
            model.asleep = False
            self.metrics.wake_seconds.labels(model.id).observe(seconds)
        log.info(
            "model %s loaded in %.2f s",
            model.id,
            seconds,
            extra={"fields": {"model": model.id, "seconds": round(seconds, 3)}},
        )

    def _check_memory(self, model: Model, tokenizer: Tokenizer) -> None:
        """Refuse a load that would not fit the memory left: the file plus every replica's KV cache."""
        config = model.spec.config
        cells = config.kv_cells(gpu_layers(config) > 0)
        kv = kv_cache_bytes(tokenizer.model, cells, config.cache_type_k, config.cache_type_v)
        need = model_bytes(model.spec.path) + kv * len(model.clients)
        import psutil  # here: only a registry's loads need it, and its import costs every start ~0.02 CPU s

        available = psutil.virtual_memory().available
        if need > available:
            raise ApiError(
                503,
                "insufficient memory",
                f"the model `{model.id}` needs {need / MIB:.0f} MiB (file and KV cache of {cells} cells"
                f" x {len(model.clients)} replicas) but {available / MIB:.0f} MiB are available",
            )

    async def _make_room(self, model: Model) -> None:
        """Under --models-max, unload the least recently used idle model first."""
        most = self._config.models_max
        loaded = [m for m in self.models if m is not model and m.status in ("loaded", "loading")]
        if not most or len(loaded) < most:
            return
        idle = sorted((m for m in loaded if m.status == "loaded" and m.idle()), key=lambda m: m.last_used)
        if not idle:
            raise ApiError(
                503, "too many models", f"{most} models are loaded and busy (--models-max); retry shortly", RETRY_AFTER
            )
        await self.unload(idle[0], "evicted")

    # ---- unloading -----------------------------------------------------------

    async def unload(self, model: Model, reason: str) -> None:
        """Stop the model's engines (what runs on them fails with 503) and wait until they are gone."""
        if model.status in ("loaded", "loading"):
            self._request_unload(model, reason)
        await self._stopped(model)

    def _request_unload(self, model: Model, reason: str) -> None:
        model.status = "unloading"
        model.unloading_since = time.monotonic()
        self.send(UnloadModel(model.id, model.info if model.asleep else None))
        self.metrics.unloads.labels(model.id, reason).inc()
        log.info("unloading model %s (%s)", model.id, reason, extra={"fields": {"model": model.id, "reason": reason}})

    async def _stopped(self, model: Model) -> None:
        try:
            await asyncio.wait_for(model.stopped.wait(), UNLOAD_WAIT)
        except asyncio.TimeoutError:
            raise ApiError(
                503, "model unloading", f"the model `{model.id}` is still stopping; retry shortly", RETRY_AFTER
            ) from None

    def engine_exited(self, notice: EngineExited) -> None:
        """The supervisor's word on an engine: restarted (its requests failed), or gone for good."""
        model = self.by_name.get(notice.model) if notice.model else self.default
        if model is None:
            return  # a model deleted since
        model.clients[notice.replica].engine_exited(notice.generation, notice.restarting, notice.reason)
        if isinstance(model.client, ReplicaSet):
            model.client.forget(notice.replica)
        if not notice.restarting and notice.reason != "unloaded" and model.status != "unloading":
            model.error = notice.reason  # it gave up on its own: it could not load, or kept crashing
            self.metrics.unloads.labels(model.id, "failed").inc()
        if notice.restarting or any(c.running for c in model.clients):
            return
        model.status = "failed" if model.error else "sleeping" if model.asleep else "unloaded"
        model.stopped.set()
        for client in model.clients:
            self.metrics.engine_gone(model.id, client.replica)
        seconds = round(time.monotonic() - model.unloading_since, 3) if model.unloading_since else None
        log.info(
            "model %s stopped",
            model.id,
            extra={"fields": {"model": model.id, "reason": notice.reason, "seconds": seconds}},
        )
        model.unloading_since = 0.0

    async def _expire(self) -> None:
        """Unload models idle past their keep-alive, put those idle past --sleep-idle-seconds to sleep; a model
        serving a request is never idle."""
        while True:
            periods = [p for m in self.models for p in (m.keep_alive if self.multi else 0, m.sleep_after) if p]
            await asyncio.sleep(max(0.2, min(periods, default=1.0) / 4))
            now = time.monotonic()
            for model in self.models:
                if model.status != "loaded":
                    continue
                if not model.idle():
                    model.last_used = now
                elif self.multi and model.keep_alive and now - model.last_used > model.keep_alive:
                    self._request_unload(model, "keep-alive")
                elif model.sleep_after and now - model.last_used > model.sleep_after:
                    model.asleep = True
                    self._request_unload(model, "sleep")

    def keep(self, model: Model, seconds: float) -> None:
        """Keep the model loaded this long once idle (negative: for good), in place of its registry's keep-alive."""
        model.kept = max(seconds, 0.0)
        if self.multi and seconds > 0 and self._expiring is None:
            self._expiring = self._spawn(self._expire())

    def send(self, msg: Control) -> None:
        """A line to the supervisor on the control pipe."""
        os.write(self._control, msgspec.json.encode(msg) + b"\n")


def card(model: Model, status: bool) -> dict:
    """A model as OpenAI lists it; with its status (and aliases) as llama-server's router does."""
    data = {"id": model.id, "object": "model", "created": int(os.path.getmtime(model.spec.path)), "owned_by": "cllm"}
    if status:
        value: dict[str, Any] = {"value": model.status}
        if model.status == "failed":
            value.update(failed=True, error=model.error)
        data.update(aliases=model.spec.aliases, status=value)
    return data
