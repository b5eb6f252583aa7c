"""The pieces below the doors that need no model: the request's template variables, the block state machine,
how a reply's finish is named, and the stream lifecycle every door shares (with a stand-in generation)."""

from __future__ import annotations

import asyncio

import pytest

from cllm.core.errors import ApiError
from cllm.core.protocol import SamplingParams
from frontend_proc.chat.reply import CALL, CONTENT, REASONING, Blocks, Reply
from frontend_proc.chat.request import ChatRequest, template_call
from frontend_proc.chat.tool_parser import ToolCallDelta
from frontend_proc.chat.tools import HERMES, ToolPlan
from frontend_proc.http import lifecycle


def test_template_context_and_calls():
    req = ChatRequest(messages=[], sampling=SamplingParams(), effort="none", template_kwargs={"x": 1})
    assert req.template_context() == {"x": 1, "reasoning_effort": "none", "enable_thinking": False}
    assert (
        ChatRequest(messages=[], sampling=SamplingParams(), thinking=True, effort="none").template_context()[
            "enable_thinking"
        ]
        is True
    )
    assert template_call("c1", "f", '{"a": 1}')["function"]["arguments"] == {"a": 1}
    assert template_call("c1", "f", "not json")["function"]["arguments"] == "not json"


class Recorder(Blocks):
    def open(self, kind, call):
        return [f"open {kind}" + (f" {call.name}" if call else "")]

    def delta(self, kind, text):
        return [f"{kind} {text!r}"]

    def close(self):
        return [f"close {self.kind}"]


def test_blocks_open_at_each_change_of_kind_and_each_new_call():
    blocks = Recorder()
    parts = [
        (REASONING, "hm"),
        (REASONING, "."),
        (CONTENT, "Hi"),
        (CALL, ToolCallDelta(0, "c0", "f")),
        (CALL, ToolCallDelta(0, arguments="{}")),
        (CALL, ToolCallDelta(1, "c1", "g")),
    ]
    assert blocks.feed(parts) + blocks.end() == [
        "open reasoning",
        "reasoning 'hm'",
        "reasoning '.'",
        "close reasoning",
        "open content",
        "content 'Hi'",
        "close content",
        "open call f",
        "call '{}'",
        "close call",
        "open call g",
        "close call",
    ]
    assert Recorder().end() == []


def test_a_reply_that_called_tools_finishes_with_tool_calls():
    plan = ToolPlan(HERMES, None, None, None, None, parse=True)
    reply = Reply(None, plan)
    parts = reply.feed('<tool_call>{"name": "f", "arguments": {}}</tool_call>') + reply.feed(None)
    assert [k for k, _ in parts].count(CALL) >= 1 and reply.calls[0].name == "f"
    assert reply.finish("stop") == "tool_calls" and reply.finish("length") == "length"
    assert Reply(None, None).finish("stop") == "stop"


class Choice:
    def __init__(self, finish):
        self.finish = finish
        self.refusal = ""


class Gen:
    """Stands in for a Generation: its pieces, then (choice, None); records close()."""

    def __init__(self, pieces, finish="stop", error=None, delay=0.0):
        self.choice, self._pieces, self._error, self._delay = Choice(finish), pieces, error, delay
        self.closed = False

    async def pieces(self):
        await asyncio.sleep(self._delay)
        for p in self._pieces:
            yield self.choice, p
        if self._error is not None:
            raise self._error
        yield self.choice, None

    def close(self):
        self.closed = True


class Door(lifecycle.Stream):
    def start(self):
        return b"<"

    def piece(self, choice, text):
        return text.encode() if text is not None else b"|"

    def end(self):
        return b">"

    def error(self, e):
        return b"error " + e.message.encode()


async def _run(gen, door=None):
    return [chunk async for chunk in lifecycle._events(gen, door or Door())]


def test_stream_lifecycle():
    gen = Gen(["a", "b"])
    assert asyncio.run(_run(gen)) == [b"<", b"a", b"b", b"|", b">"] and gen.closed
    # An error inside the stream is said in the door's shape; the generation is closed all the same.
    gen = Gen(["a"], error=ApiError(503, "engine unavailable", "gone"))
    assert asyncio.run(_run(gen)) == [b"<", b"a", b"error gone"] and gen.closed
    # A choice the engine refused (its grammar led nowhere) ends the stream with the refusal.
    gen = Gen(["a"], finish="error")
    out = asyncio.run(_run(gen))
    assert out[:2] == [b"<", b"a"] and out[2].startswith(b"error the engine gave up") and len(out) == 3 and gen.closed


def test_pings_while_the_first_piece_is_awaited(monkeypatch):
    monkeypatch.setattr(lifecycle, "PING_SECONDS", 0.01)

    class Pinging(Door):
        ping = b"."

    out = asyncio.run(_run(Gen(["a"], delay=0.05), Pinging()))
    assert out[0] == b"<" and out[1] == b"." and out[-3:] == [b"a", b"|", b">"] and set(out[1:-3]) == {b"."}


@pytest.mark.parametrize("pieces", [[], ["x"]])
def test_no_ping_without_a_wait(pieces):
    class Pinging(Door):
        ping = b"."

    assert b"." not in asyncio.run(_run(Gen(pieces), Pinging()))
