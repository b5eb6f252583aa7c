"""The frontend's session protocol over real rings, with the test playing the engine's side.

No model is involved: this is about records on the rings when an engine dies
while the frontend waits for room, and what the next engine gets to read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from cllm.core.config import ServeConfig
from cllm.core.errors import ApiError
from cllm.core.launch import EngineRings
from cllm.core.protocol import (
    Embed,
    Embeddings,
    EngineReady,
    Hello,
    SamplingParams,
    SeqOutput,
    StepOutputs,
    Submit,
    ToEngine,
)
from cllm.core.ring import Ring
from frontend_proc.engine.client import EngineClient
from frontend_proc.engine.metrics import Metrics
from tests.conftest import model_info

INFO = model_info()
PROMPT = list(range(1, 300))  # a Submit of about 600 bytes: a few fill the request ring


class FakeEngine:
    """The engine's side of the rings, doing what engine_proc.main does with them."""

    def __init__(self, requests: Ring, outputs: Ring, generation: int):
        self.requests, self.outputs, self.generation = requests, outputs, generation
        self.session: int | None = None
        self.decode = msgspec.msgpack.Decoder(ToEngine).decode
        self.encode = msgspec.msgpack.Encoder().encode

    def serve_records(self) -> list:
        """Drain the request ring; answer Hellos; return what counts (after the first Hello)."""
        counted: list[Any] = []
        for record in self.requests.drain():
            msg = self.decode(record)
            if type(msg) is Hello:
                self.session = msg.session
                counted.clear()
                assert self.outputs.try_put(self.encode(EngineReady(INFO, msg.session, self.generation)))
            elif self.session is not None:
                counted.append(msg)
        return counted

    def finish(self, rid: int, tokens: list[int]) -> None:
        outs = [SeqOutput(rid, t) for t in tokens[:-1]] + [SeqOutput(rid, tokens[-1], "length")]
        assert self.outputs.try_put(self.encode(StepOutputs(outs)))


async def until(check, timeout: float = 5.0):
    for _ in range(int(timeout / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


@pytest.fixture
def rings():
    requests, outputs = Ring.create(4096), Ring.create(1 << 16)
    yield requests, outputs
    for ring in (requests, outputs):
        ring.close()
        ring.close_fds()


def test_engine_death_while_the_frontend_waits_for_room(rings):
    requests, outputs = rings

    async def scenario():
        client = EngineClient(ServeConfig(request_timeout=0), EngineRings(requests.spec, outputs.spec), Metrics())
        client.start()
        first = FakeEngine(Ring(requests.spec), Ring(outputs.spec), generation=0)
        await until(lambda: first.serve_records() == [] and first.session is not None)
        await asyncio.wait_for(client.ready, 5)
        assert client.info == INFO

        # The engine stops reading: submits fill the ring, then one waits for room.
        sampling = SamplingParams(max_tokens=5)
        running = []
        while True:
            blocked = asyncio.ensure_future(client.submit(PROMPT, sampling, per_step=False))
            await asyncio.sleep(0.1)
            if not blocked.done():
                break
            running.append(blocked.result())
        assert running
        results = [asyncio.ensure_future(s.result()) for s in running]

        client.engine_exited(0)  # the supervisor's notice
        with pytest.raises(ApiError) as e:
            await asyncio.wait_for(blocked, 1)
        assert e.value.status == 503
        for r in results:
            with pytest.raises(ApiError, match="engine failed"):
                await asyncio.wait_for(r, 1)
        assert client.info is None and client.in_flight == 0
        with pytest.raises(ApiError) as e:
            await client.submit(PROMPT, sampling, per_step=False)
        assert e.value.status == 503  # not ready until the next engine answers

        # The next engine reads the stale records, skips them, answers the new Hello.
        second = FakeEngine(Ring(requests.spec), Ring(outputs.spec), generation=1)
        await until(lambda: second.serve_records() == [] and second.session is not None)
        await until(lambda: client.info is not None)
        assert client.generation == 1

        stream = await client.submit(PROMPT, sampling, per_step=False)
        counted: list[Any] = []
        await until(lambda: counted.extend(second.serve_records()) or counted)
        assert [type(m) for m in counted] == [Submit] and counted[0].id == stream.id  # nothing stale, nothing lost
        second.finish(stream.id, [7, 8, 9, 10, 11])
        assert await asyncio.wait_for(stream.result(), 5) == [7, 8, 9, 10, 11]
        client.stop()

    asyncio.run(scenario())


def test_a_new_frontend_ignores_what_the_engine_said_to_the_old_one(rings):
    requests, outputs = rings
    engine = FakeEngine(Ring(requests.spec), Ring(outputs.spec), generation=0)
    encode = msgspec.msgpack.Encoder().encode
    # What a frontend that died left unread: an answer to its Hello, outputs for its request 1.
    assert outputs.try_put(encode(EngineReady(INFO, 12345, 0)))
    assert outputs.try_put(encode(StepOutputs([SeqOutput(1, 42, "length")])))

    async def scenario():
        client = EngineClient(ServeConfig(), EngineRings(requests.spec, outputs.spec), Metrics())
        client.start()
        await asyncio.sleep(0.1)
        assert client.info is None  # the stale answer was not for this client
        await until(lambda: engine.serve_records() == [] and engine.session is not None)
        await asyncio.wait_for(client.ready, 5)
        stream = await client.submit(PROMPT, SamplingParams(max_tokens=2), per_step=False)
        assert stream.id == 1 and stream.tokens == []  # the old request 1's token never reaches it
        engine.serve_records()
        engine.finish(1, [5, 6])
        assert await asyncio.wait_for(stream.result(), 5) == [5, 6]
        client.stop()

    asyncio.run(scenario())


def test_an_embeddings_error_fails_that_request_with_a_503(rings):
    requests, outputs = rings
    engine = FakeEngine(Ring(requests.spec), Ring(outputs.spec), generation=0)

    async def scenario():
        client = EngineClient(ServeConfig(), EngineRings(requests.spec, outputs.spec), Metrics())
        client.start()
        await until(lambda: engine.serve_records() == [] and engine.session is not None)
        await asyncio.wait_for(client.ready, 5)
        job = asyncio.ensure_future(client.embed([[1, 2, 3]]))
        counted: list[Any] = []
        await until(lambda: counted.extend(engine.serve_records()) or counted)
        assert [type(m) for m in counted] == [Embed]
        assert engine.outputs.try_put(engine.encode(Embeddings(counted[0].id, 0, b"", "no room for it")))
        with pytest.raises(ApiError, match="embeddings unavailable") as e:
            await asyncio.wait_for(job, 5)
        assert e.value.status == 503 and client.in_flight == 0
        client.stop()

    asyncio.run(scenario())
