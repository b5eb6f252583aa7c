"""The frontend's end of the rings: submit, abort, and fan step outputs out.

The output ring's wake-up pipe is watched by the event loop, so the frontend
sleeps until the engine publishes a step, then demultiplexes that one record
to the requests it concerns. A non-streaming request is woken once, when it
finishes; a streaming one once per step.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import msgspec

from cllm.launch import Launch
from cllm.protocol import (
    Abort,
    EngineReady,
    EngineStats,
    FromEngine,
    ModelInfo,
    SamplingParams,
    StepOutputs,
    Submit,
    TokenLogprobs,
)
from cllm.ring import Ring
from frontend_proc.metrics import Metrics


class RequestStream:
    """Tokens of one request as they arrive from the engine."""

    __slots__ = ("id", "prompt_tokens", "tokens", "logprobs", "finish", "t_submit", "t_first", "t_done", "_tail", "_event", "_per_step")

    def __init__(self, rid: int, prompt_tokens: int, per_step: bool):
        self.id = rid
        self.prompt_tokens = prompt_tokens
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprobs] = []  # one per token, when the request asked for them
        self.finish: str | None = None
        self.t_submit = time.perf_counter()
        self.t_first: float | None = None
        self.t_done: float | None = None  # when it finished, or was aborted
        self._tail = 0  # 1 when the engine's last output carried no token (it sampled EOS)
        self._event = asyncio.Event()
        self._per_step = per_step

    def time_per_output(self) -> float | None:
        """Mean time between the engine's outputs after the first token, once done."""
        outputs = len(self.tokens) + self._tail
        if self.t_first is None or self.t_done is None or outputs < 2:
            return None
        return (self.t_done - self.t_first) / (outputs - 1)

    def _push(self, token: int | None, finish: str | None, logprobs: TokenLogprobs | None) -> None:
        if token is not None:
            if self.t_first is None:
                self.t_first = time.perf_counter()
            self.tokens.append(token)
            if logprobs is not None:
                self.logprobs.append(logprobs)
        if finish is not None:
            self.finish = finish
            self.t_done = time.perf_counter()
            self._tail = token is None
            self._event.set()
        elif self._per_step:
            self._event.set()

    async def updates(self):
        """Yield lists of new token ids until the request finishes."""
        sent = 0
        while True:
            await self._event.wait()
            self._event.clear()
            if len(self.tokens) > sent:
                new = self.tokens[sent:]
                sent = len(self.tokens)
                yield new
            if self.finish is not None:
                return

    async def result(self) -> list[int]:
        async for _ in self.updates():
            pass
        return self.tokens


class EngineClient:
    def __init__(self, launch: Launch, metrics: Metrics):
        self.metrics = metrics
        self._requests = Ring(launch.requests)
        self._outputs = Ring(launch.outputs)
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(FromEngine).decode
        self._ids = itertools.count(1)
        self._streams: dict[int, RequestStream] = {}
        self._submit_lock = asyncio.Lock()
        self._aborts: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready: asyncio.Future[ModelInfo] | None = None
        self.info: ModelInfo | None = None
        self.stats: EngineStats | None = None
        self.ready_at: float | None = None  # when the current engine said it was ready
        self.restarts = 0  # engines started after the first

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.ready = self._loop.create_future()
        self._loop.add_reader(self._outputs.data_fd, self._on_outputs)
        self._on_outputs()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._outputs.data_fd)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    async def submit(self, prompt: list[int], sampling: SamplingParams, per_step: bool) -> RequestStream:
        stream = RequestStream(next(self._ids), len(prompt), per_step)
        self._streams[stream.id] = stream
        try:
            await self._put(self._encode(Submit(stream.id, prompt, sampling)))
        except BaseException:
            del self._streams[stream.id]
            raise
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Stop a request that has not finished; the engine frees its slot next step."""
        if stream.finish is not None or self._streams.pop(stream.id, None) is None:
            return
        stream.t_done = time.perf_counter()
        if not self._aborts:
            self._loop.call_soon(self._flush_aborts)
        self._aborts.append(stream.id)

    def _flush_aborts(self) -> None:
        ids, self._aborts = self._aborts, []
        payload = self._encode(Abort(ids))
        if not self._requests.try_put(payload):
            self._loop.create_task(self._put(payload))

    async def _put(self, payload: bytes) -> None:
        async with self._submit_lock:
            while not self._requests.try_put(payload):
                if self._requests.arm_space_wait(len(payload)):
                    room = self._loop.create_future()
                    self._loop.add_reader(self._requests.space_fd, room.set_result, None)
                    try:
                        await room
                    finally:
                        self._loop.remove_reader(self._requests.space_fd)
                        self._requests.end_space_wait()

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
                            stream._push(out.token, out.finish, out.logprobs)
                            if out.finish is not None:
                                del streams[out.id]
                elif type(msg) is EngineStats:
                    self.stats = msg
                    self.metrics.engine_stats(msg, self.info.ctx_size, time.monotonic())
                elif type(msg) is EngineReady:
                    restarted = self.info is not None
                    self.restarts += restarted
                    self.info = msg.info
                    self.stats = None  # a new engine runs nothing yet
                    self.ready_at = time.monotonic()
                    self.metrics.engine_ready(self.ready_at, restarted)
                    if not self.ready.done():
                        self.ready.set_result(msg.info)
            if ring.arm_wait():
                return
