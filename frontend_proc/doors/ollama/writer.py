"""Ollama's answer: a chat message or a generate response, whole or as a stream of JSON lines, the last one done
with the timings in nanoseconds."""

from __future__ import annotations

import json
import time

import msgspec

from cllm.core.errors import ApiError
from frontend_proc.chat.reply import CONTENT, REASONING, Reply, join
from frontend_proc.core.generation import Generation
from frontend_proc.doors.ollama.models import now
from frontend_proc.http import lifecycle

NDJSON = "application/x-ndjson"
_json = msgspec.json.Encoder()


def line(obj) -> bytes:
    return _json.encode(obj) + b"\n"


def tool_calls(reply: Reply) -> list[dict]:
    out: list[dict] = []
    for c in reply.calls:
        try:
            arguments = json.loads(c.arguments)
        except ValueError:
            arguments = {}
        out.append(
            {
                "id": c.id,
                "function": {
                    "index": len(out),
                    "name": c.name,
                    "arguments": arguments if isinstance(arguments, dict) else {},
                },
            }
        )
    return out


def done(gen: Generation, reply: Reply, t0: int, load_ns: int) -> dict:
    """The last object's fields: why it ended, and its counts and timings in nanoseconds."""
    rs = gen.choices[0].stream
    first = rs.t_first or rs.t_done or time.perf_counter()
    last = rs.t_done or time.perf_counter()
    finish = reply.finish(gen.choices[0].finish)
    return {
        "done": True,
        "done_reason": "length" if finish == "length" else "stop",
        "total_duration": time.perf_counter_ns() - t0,
        "load_duration": load_ns,
        "prompt_eval_count": gen.prompt_tokens,
        "prompt_eval_duration": int((first - rs.t_submit) * 1e9),
        "eval_count": gen.completion_tokens,
        "eval_duration": int((last - first) * 1e9),
    }


class Writer:
    """One route's objects: a chat message, or a generate response."""

    def __init__(self, name: str, chat_route: bool):
        self.name, self.chat_route = name, chat_route

    def obj(self, content: str, thinking: str, calls: list[dict] | None = None) -> dict:
        out: dict = {"model": self.name, "created_at": now()}
        if self.chat_route:
            message: dict = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        return out


class Stream(lifecycle.Stream):
    """A JSON object a line: each piece of the answer and thinking, the calls once read, then the done object."""

    media_type = NDJSON
    ping = None  # NDJSON has no comment line: a blank one would fail a client's JSON parse

    def __init__(self, gen: Generation, reply: Reply, writer: Writer, t0: int, load_ns: int):
        self.gen, self.reply, self.writer, self.t0, self.load_ns = gen, reply, writer, t0, load_ns

    def piece(self, choice, text: str | None) -> bytes:
        parts = self.reply.feed(text)
        content, thinking = join(parts, CONTENT), join(parts, REASONING)
        out = line({**self.writer.obj(content, thinking), "done": False}) if content or thinking else b""
        if text is None and self.reply.calls:
            out += line({**self.writer.obj("", "", tool_calls(self.reply)), "done": False})
        return out

    def end(self) -> bytes:
        return line({**self.writer.obj("", ""), **done(self.gen, self.reply, self.t0, self.load_ns)})

    def error(self, e: ApiError) -> bytes:
        return line({"error": e.message or e.error})
