"""Anthropic's message: its content blocks (thinking, text, tool_use), whole or as its stream of events."""

from __future__ import annotations

import json

from cllm.core.errors import ApiError
from frontend_proc.chat.reply import CALL, CONTENT, REASONING, Blocks, Reply
from frontend_proc.chat.tool_parser import ToolCallDelta
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.http import lifecycle
from frontend_proc.http.errors import error_body
from frontend_proc.http.sse import sse_event

PATH = "/v1/messages"
PING = sse_event("ping", {"type": "ping"})  # once after message_start, as Anthropic's streams open


def stop_reason(choice: Choice, reply: Reply) -> str:
    finish = reply.finish(choice.finish)
    if finish == "length":
        return "max_tokens"
    if finish == "tool_calls":
        return "tool_use"
    return "stop_sequence" if choice.stop_string is not None else "end_turn"


def message_object(gen: Generation, model: str) -> dict:
    """The message object, without content or stop reason yet."""
    return {
        "id": f"msg_{gen.choices[0].stream.id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage(gen),
    }


def usage(gen: Generation) -> dict:
    """Anthropic's usage: input_tokens are only those the prefix cache did not serve, which it reports apart.

    Nothing is written to a cache on request (cache_control is not needed
    here: every prompt's prefix is reused), so cache_creation_input_tokens is 0.
    """
    cached = gen.cached_tokens
    return {
        "input_tokens": gen.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": gen.completion_tokens,
    }


def content_block(kind: str, part) -> dict:
    if kind == REASONING:
        return {"type": "thinking", "thinking": part, "signature": ""}
    if kind == CALL:
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": {}}
    return {"type": "text", "text": part}


DELTA = {
    REASONING: ("thinking_delta", "thinking"),
    CALL: ("input_json_delta", "partial_json"),
    CONTENT: ("text_delta", "text"),
}


def arguments(arguments: str) -> dict:
    """A call's input: an object (the grammar makes it one; {} if the model wrote none)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class ContentBlocks(Blocks):
    """Content blocks, each as content_block_start, its deltas, content_block_stop."""

    def __init__(self):
        super().__init__()
        self.index = -1

    def open(self, kind: str, call: ToolCallDelta | None) -> list[bytes]:
        self.index += 1
        block = content_block(kind, "" if call is None else call)
        return [
            sse_event(
                "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
            )
        ]

    def delta(self, kind: str, text: str) -> list[bytes]:
        type_, key = DELTA[kind]
        return [
            sse_event(
                "content_block_delta",
                {"type": "content_block_delta", "index": self.index, "delta": {"type": type_, key: text}},
            )
        ]

    def close(self) -> list[bytes]:
        return [sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]


class Stream(lifecycle.Stream):
    """message_start, ping, per block start/deltas/stop, message_delta, message_stop; while the reply waits,
    keep-alive comments (lifecycle.Stream.ping)."""

    def __init__(self, gen: Generation, reply: Reply, model: str):
        self.gen, self.reply, self.model = gen, reply, model
        self.blocks = ContentBlocks()

    def start(self) -> bytes:
        start = message_object(self.gen, self.model)
        start["usage"]["output_tokens"] = 0
        return sse_event("message_start", {"type": "message_start", "message": start}) + PING

    def piece(self, choice: Choice, text: str | None) -> bytes:
        return b"".join(self.blocks.feed(self.reply.feed(text)))

    def end(self) -> bytes:
        choice = self.gen.choices[0]
        delta = {"stop_reason": stop_reason(choice, self.reply), "stop_sequence": choice.stop_string}
        # Cumulative, as Anthropic sends it: the cache's hit is known only once the prompt was read, after
        # message_start.
        end = [sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(self.gen)})]
        return b"".join([*self.blocks.end(), *end, sse_event("message_stop", {"type": "message_stop"})])

    def error(self, e: ApiError) -> bytes:
        return sse_event("error", error_body(PATH, e))
