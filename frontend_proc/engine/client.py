"""The frontend's end of the rings: submit, abort, and fan step outputs out.

The output ring's wake-up pipe is watched by the event loop, so the frontend
sleeps until the engine publishes a step, then demultiplexes that one record
to the requests it concerns. A non-streaming request is woken once, when it
finishes; a streaming one once per step.

The client talks to the engine in sessions. It says Hello(session) and serves
once the engine answers EngineReady(session); anything read before that answer
was meant for a frontend that died. When the supervisor reports the engine
died, the client fails every request in flight with 503, writes nothing more
for that session, and says Hello again, to the engine the supervisor starts.

An engine may also be stopped for good (its model unloaded, or given up):
then its requests fail with 503 and the client stays silent until it is
loaded again (``hello``). The supervisor tells the client once the process is
gone, so the next engine never reads a Hello meant for the last one.

Requests are bounded here, where the engine's size is known: at most
``parallel + --max-waiting`` in flight (else 429), each cancelled with 408
past ``--request-timeout``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Iterator

import msgspec

from cllm.core.config import ServeConfig
from cllm.core.errors import RETRY_AFTER, ApiError
from cllm.core.image_grid import prompt_images
from cllm.core.launch import EngineRings
from cllm.core.protocol import (
    Abort,
    Embed,
    Embeddings,
    EngineReady,
    EngineStats,
    FromEngine,
    Hello,
    ImageInput,
    LoraDone,
    LoraLoad,
    ModelInfo,
    SamplingParams,
    SlotAction,
    SlotDone,
    StepOutputs,
    Submit,
)
from cllm.core.ring import Ring
from frontend_proc.engine.limits import Limits
from frontend_proc.engine.metrics import Metrics
from frontend_proc.engine.request_stream import EmbeddingJob, RequestStream


def not_ready() -> ApiError:
    return ApiError(503, "not ready", "the engine is starting; retry shortly", RETRY_AFTER)


class EngineClient:
    def __init__(
        self,
        config: ServeConfig,
        rings: EngineRings,
        metrics: Metrics,
        model: str = "",
        replica: int = 0,
        ids: Iterator[int] | None = None,
    ):
        self.metrics = metrics
        self._ids = ids or itertools.count(1)  # request ids: shared by the clients of one frontend, unique in all
        self.model, self.replica = model, replica
        self._config = config
        self._requests = Ring(rings.requests)
        self._outputs = Ring(rings.outputs)
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(FromEngine).decode
        self._streams: dict[int, RequestStream] = {}
        self._embeddings: dict[int, EmbeddingJob] = {}
        self._slot_actions: dict[int, asyncio.Future[SlotDone]] = {}
        self._lora_loads: dict[int, asyncio.Future[LoraDone]] = {}
        self._submit_lock = asyncio.Lock()
        self._room: asyncio.Future | None = None  # set while a record waits for ring space
        self._aborts: list[int] = []
        self._session = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready: asyncio.Future[ModelInfo] | None = None  # the first answer to the last hello()
        self.info: ModelInfo | None = None  # None while no engine has answered our Hello
        self.limits: Limits | None = None
        self.generation = 0  # of the engine that answered: how often it was restarted
        self.stats: EngineStats | None = None
        self.ready_at: float | None = None  # when the current engine answered
        self._max_in_flight = 0
        self.running = False  # an engine runs (or starts) for us: False once the supervisor says it stopped for good

    def start(self, running: bool = True) -> None:
        """Attach to the rings; ``running``: an engine runs or starts on them, so say Hello."""
        self._loop = asyncio.get_running_loop()
        self._requests.end_space_wait()  # a frontend that died before us may have left it up
        self._loop.add_reader(self._outputs.data_fd, self._on_outputs)
        if running:
            self.hello()
        self._on_outputs()

    def hello(self) -> asyncio.Future[ModelInfo]:
        """Start a session with the engine about to run; the future is its answer."""
        self.running = True
        self.ready = self._loop.create_future()
        self.ready.add_done_callback(_retrieved)
        self._hello()
        return self.ready

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._outputs.data_fd)

    @property
    def in_flight(self) -> int:
        return len(self._streams) + len(self._embeddings)

    @property
    def streams(self) -> list[RequestStream]:
        """The requests in flight, oldest first."""
        return list(self._streams.values())

    def _check_room(self) -> None:
        if self.info is None:
            raise not_ready()
        if self.in_flight >= self._max_in_flight:
            raise ApiError(
                429,
                "too many requests",
                f"{self._config.max_waiting} requests are already waiting for one of {self.info.parallel} slots",
                RETRY_AFTER,
            )

    async def embed(self, inputs: list[list[int]], rank: bool = False) -> bytes:
        """The inputs' vectors: len(inputs) x dim float32s; with ``rank``, rerank prompts' scores, a float32 each.
        Cancelled (a hang-up, the deadline), the engine drops the rest of the request."""
        self._check_room()
        rid = next(self._ids)
        assert self.info is not None  # _check_room: not ready otherwise
        dim = 1 if rank else self.info.embedding_dim
        job = self._embeddings[rid] = EmbeddingJob(len(inputs), dim, self._loop.create_future())
        timeout = self._config.request_timeout or None
        try:
            if not await self._put(self._encode(Embed(rid, inputs, rank))):
                raise not_ready()
            return await asyncio.wait_for(job.done, timeout)
        except asyncio.TimeoutError:
            raise ApiError(
                408, "request timeout", f"the request took longer than {self._config.request_timeout:g} s"
            ) from None
        finally:
            if self._embeddings.pop(rid, None) is not None and not job.done.done():
                self._abort_id(rid)

    async def slot_action(self, slot: int, action: str, path: str = "") -> SlotDone:
        """llama-server's slot action on the engine's KV stream ``slot``, answered once no sequence runs in it."""
        ask = lambda rid: SlotAction(rid, slot, action, path)  # noqa: E731
        return await self._answered(self._slot_actions, ask, "the slot stayed busy")

    async def lora(self, adapter: int, path: str = "", unload: bool = False) -> str:
        """Load ``path`` into the engine as LoRA adapter ``adapter`` (or unload it); why llama.cpp refused, or ""."""
        ask = lambda rid: LoraLoad(rid, adapter, path, unload)  # noqa: E731
        return (await self._answered(self._lora_loads, ask, "the adapter took")).error

    async def _answered(self, futures: dict, ask, late: str):
        """Send the engine the record ``ask(id)`` and wait, within the request timeout, for its answer, which the
        output reader sets in ``futures`` under that id; ``late`` says what took longer, in the 408."""
        if self.info is None:
            raise not_ready()
        rid = next(self._ids)
        done = futures[rid] = self._loop.create_future()
        try:
            if not await self._put(self._encode(ask(rid))):
                raise not_ready()
            return await asyncio.wait_for(done, self._config.request_timeout or None)
        except asyncio.TimeoutError:
            raise ApiError(408, "request timeout", f"{late} longer than {self._config.request_timeout:g} s") from None
        finally:
            futures.pop(rid, None)

    async def submit(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        per_step: bool,
        images: list[ImageInput] | None = None,
        scope: int = 0,
    ) -> RequestStream:
        """images: the prompt's, each taking the tokens its size and the projector give it (counted in the stream's
        prompt_tokens: cllm/core/image_grid.py). scope: the client's (Submit.scope)."""
        self._check_room()
        positions = len(prompt) + (prompt_images(self.info, images) if self.info else 0)
        stream = RequestStream(next(self._ids), self, positions, per_step, sampling)
        self._streams[stream.id] = stream
        if self._config.request_timeout:
            stream.timer = self._loop.call_later(self._config.request_timeout, self._time_out, stream)
        try:
            if not await self._put(
                self._encode(Submit(stream.id, prompt, sampling, per_step, images or [], scope)), stream
            ):
                raise stream.error or not_ready()
        except BaseException:
            self.abort(stream)
            raise
        return stream

    def cancel(self, stream: RequestStream, error: ApiError) -> None:
        """End a request early: its reader gets ``error``, the engine drops it next step."""
        stream.fail(error)
        self.abort(stream)

    def abort(self, stream: RequestStream) -> None:
        """The caller is done with the request: if the engine still runs it, stop it there."""
        if stream.timer is not None:
            stream.timer.cancel()
        if self._streams.pop(stream.id, None) is None:
            return  # finished, or its engine died
        stream.t_done = time.perf_counter()
        self._abort_id(stream.id)

    def _abort_id(self, rid: int) -> None:
        if not self._aborts:
            self._loop.call_soon(self._flush_aborts)
        self._aborts.append(rid)

    def _time_out(self, stream: RequestStream) -> None:
        self.cancel(
            stream, ApiError(408, "request timeout", f"the request took longer than {self._config.request_timeout:g} s")
        )

    def _flush_aborts(self) -> None:
        ids, self._aborts = self._aborts, []
        if ids:
            payload = self._encode(Abort(ids))
            if not self._requests.try_put(payload):
                self._loop.create_task(self._put(payload))

    async def _put(self, payload: bytes, stream: RequestStream | None = None) -> bool:
        """Append a record, waiting for room; False if its session (or its stream) ended first."""
        session = self._session
        async with self._submit_lock:
            while self._session == session and (stream is None or stream.error is None):
                if self._requests.try_put(payload):
                    return True
                if self._requests.arm_space_wait(len(payload)):
                    self._room = room = self._loop.create_future()
                    self._loop.add_reader(self._requests.space_fd, _wake, room)
                    try:
                        await room
                    finally:
                        self._room = None
                        self._loop.remove_reader(self._requests.space_fd)
                        self._requests.end_space_wait()
        return False

    def _hello(self) -> None:
        # Random: an engine's answer to another frontend's Hello is never taken for ours.
        self._session = int.from_bytes(os.urandom(8), "little") >> 1
        self._loop.create_task(self._put(self._encode(Hello(self._session))))

    def engine_exited(self, generation: int, restarting: bool = True, reason: str = "") -> None:
        """The supervisor reports the engine of ``generation`` died (and starts the next, if restarting)."""
        self._on_outputs()  # first, whatever it published before it died
        if restarting and self.info is not None and self.generation > generation:
            return  # a later engine already answered our Hello: nothing of ours was lost
        why = "it is restarting" if restarting else f"the model was stopped: {reason}"
        self._fail_all(
            ApiError(503, "engine failed", f"the engine stopped while serving this request; {why}", RETRY_AFTER)
        )
        if restarting:
            self._hello()
            return
        self.running = False
        if self.ready is not None and not self.ready.done():
            self.ready.set_exception(
                ApiError(503, "model unavailable", f"the model could not start: {reason}", RETRY_AFTER)
            )

    def _fail_all(self, error: ApiError) -> None:
        self.info = self.stats = None
        self._aborts.clear()
        streams, self._streams = self._streams, {}
        jobs, self._embeddings = self._embeddings, {}
        for stream in streams.values():
            stream.fail(error)
        for job in jobs.values():
            if not job.done.done():
                job.done.set_exception(error)
        for done in self._slot_actions.values():
            if not done.done():
                done.set_exception(error)
        if self._room is not None and not self._room.done():
            self._room.set_result(None)  # a record waiting for room: it is stale now
        self._session += 1  # what still waits to be written belongs to no session now

    def _on_outputs(self) -> None:
        ring = self._outputs
        ring.end_wait()
        while True:
            for record in ring.drain():
                msg = self._decode(record)
                if type(msg) is StepOutputs:
                    streams = self._streams
                    for out in msg.outputs:
                        stream = streams.get(out.id)
                        if stream is not None:
                            if out.prompt_logprobs is not None:
                                stream.prompt_logprobs = out.prompt_logprobs
                            stream.push(out)
                            if out.finish is not None:
                                del streams[out.id]
                elif type(msg) is Embeddings:
                    job = self._embeddings.get(msg.id)
                    if job is not None and job.push(msg):
                        del self._embeddings[msg.id]
                elif type(msg) is SlotDone:
                    done = self._slot_actions.get(msg.id)
                    if done is not None and not done.done():
                        done.set_result(msg)
                elif type(msg) is LoraDone:
                    loaded = self._lora_loads.get(msg.id)
                    if loaded is not None and not loaded.done():
                        loaded.set_result(msg)
                elif type(msg) is EngineStats and self.info is not None:  # else left for a frontend that died
                    self.stats = msg
                    self.metrics.engine_stats(msg, self.info.ctx_size, time.monotonic(), self.model, self.replica)
                elif type(msg) is EngineReady and msg.session == self._session:
                    self._on_ready(msg)
            if ring.arm_wait():
                return

    def _on_ready(self, msg: EngineReady) -> None:
        self.info, self.generation = msg.info, msg.generation
        self.limits = Limits.of(self._config, msg.info)
        self._max_in_flight = msg.info.parallel + self._config.max_waiting
        self.ready_at = time.monotonic()
        self.metrics.engine_ready(self.ready_at, msg.generation, self.model, self.replica)
        if not self.ready.done():
            self.ready.set_result(msg.info)


def _retrieved(future: asyncio.Future) -> None:
    """A failed load is answered to whoever waited; no one waiting is no error to log."""
    if not future.cancelled():
        future.exception()


def _wake(room: asyncio.Future) -> None:
    """The ring has room again: the submit waiting on ``room`` goes on."""
    if not room.done():
        room.set_result(None)
