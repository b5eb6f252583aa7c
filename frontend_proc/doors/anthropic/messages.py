"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

Claude Code and the `anthropic` SDK speak it. A door: the request is read
into a ChatRequest for the chat layer (frontend_proc.chat.chat), and the reply's
parts (frontend_proc.chat.reply) are written as content blocks (thinking, text,
tool_use), whole or as Anthropic's stream of events (frontend_proc.http.lifecycle).
Errors take Anthropic's shape (errors.py).
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError
from frontend_proc.chat import chat
from frontend_proc.chat.reply import CALL, CONTENT, REASONING, Blocks, Reply
from frontend_proc.chat.request import ChatRequest, Fields, not_text, template_call
from frontend_proc.chat.tool_parser import ToolCallDelta
from frontend_proc.chat.tools import Tool
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.core.output import JsonOutput
from frontend_proc.doors.anthropic.schemas import (
    CountTokensRequest, DocumentBlock, ImageBlock, MessagesRequest, TextBlock, ThinkingDisabled, ToolChoiceAny, ToolChoiceNone,
    ToolChoiceTool, ToolResultBlock, ToolUseBlock,
)
from frontend_proc.http import lifecycle
from frontend_proc.http.app import model_state
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import error_body, json_response
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation
from frontend_proc.http.sse import sse_event

_PATH = "/v1/messages"
_PING = sse_event("ping", {"type": "ping"})  # while a stream waits for its first token, as Anthropic keeps idle streams alive
_FIELDS = Fields(output="output_config.format", tool_schema="tools[{}]")


def _refuse(block: ImageBlock | DocumentBlock, param: str) -> ApiError:
    return not_text("image" if isinstance(block, ImageBlock) else "document", param)


def _text(blocks: str | list, param: str) -> str:
    """The text of a string or of text blocks; anything that is not text is refused."""
    if isinstance(blocks, str):
        return blocks
    for i, block in enumerate(blocks):
        if isinstance(block, (ImageBlock, DocumentBlock)):
            raise _refuse(block, f"{param}[{i}]")
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))


def template_messages(body: CountTokensRequest) -> list[dict]:
    """Anthropic's conversation as chat-template messages (tool_use as tool_calls, tool_result as tool messages)."""
    out: list[dict] = []
    if body.system:
        out.append({"role": "system", "content": _text(body.system, "system")})
    for i, message in enumerate(body.messages):
        param = f"messages[{i}].content"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        texts, calls = [], []
        for j, block in enumerate(message.content):
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, (ImageBlock, DocumentBlock)):
                raise _refuse(block, f"{param}[{j}]")
            elif isinstance(block, ToolUseBlock):
                calls.append(template_call(block.id, block.name, block.input))
            elif isinstance(block, ToolResultBlock):
                content = _text(block.content, f"{param}[{j}].content")
                out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
            # thinking blocks of earlier turns are not sent back to the model, as Anthropic's own API does
        if texts or calls or not message.content:
            entry = {"role": message.role, "content": "".join(texts)}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
    return out


def chat_request(body: CountTokensRequest) -> ChatRequest:
    choice = body.tool_choice
    fmt = body.output_config.format if body.output_config else None
    return ChatRequest(
        messages=template_messages(body),
        sampling=None,  # counting tokens samples nothing; messages() sets it
        tools=[Tool(t.name, t.description, json.dumps(t.input_schema)) for t in body.tools or ()],
        tool_choice={ToolChoiceAny: "required", ToolChoiceTool: getattr(choice, "name", None), ToolChoiceNone: "none"}.get(type(choice), "auto"),
        parallel_tool_calls=choice is None or not getattr(choice, "disable_parallel_tool_use", False),
        output=JsonOutput(fmt.schema) if fmt else None,
        thinking=None if body.thinking is None else not isinstance(body.thinking, ThinkingDisabled),
        effort=body.output_config.effort if body.output_config else None,
        fields=_FIELDS,
    )


def _stop_reason(choice: Choice, reply: Reply) -> str:
    finish = reply.finish(choice.finish)
    if finish == "length":
        return "max_tokens"
    if finish == "tool_calls":
        return "tool_use"
    return "stop_sequence" if choice.stop_string is not None else "end_turn"


def _message(gen: Generation, model: str) -> dict:
    """The message object, without content or stop reason yet."""
    return {
        "id": f"msg_{gen.choices[0].stream.id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(gen),
    }


def _usage(gen: Generation) -> dict:
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


def _block(kind: str, part) -> dict:
    if kind == REASONING:
        return {"type": "thinking", "thinking": part, "signature": ""}
    if kind == CALL:
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": {}}
    return {"type": "text", "text": part}


_DELTA = {REASONING: ("thinking_delta", "thinking"), CALL: ("input_json_delta", "partial_json"), CONTENT: ("text_delta", "text")}


async def messages(request: Request) -> Response:
    body = await decode_body(request, MessagesRequest)
    st = await model_state(request, body.model)
    req = chat_request(body)
    req.sampling = body.params(body.max_tokens)
    req.stops, req.stream = body.stop_sequences or (), body.stream
    prompt = chat.prompt(st, req)
    gen = await chat.start(st, req, prompt)
    if body.stream:
        return lifecycle.stream(gen, _Stream(gen, prompt.reply(), st.model_id))
    (text,) = await lifecycle.whole(request, gen)
    choice, reply = gen.choices[0], prompt.reply()
    message = _message(gen, st.model_id)
    parts = reply.whole(text)
    blocks = [_block(kind, part) for kind, part in parts if kind != CALL and not (reply.calls and kind == CONTENT and not part.strip())]
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _arguments(c.arguments)} for c in reply.calls]
    message["content"] = blocks
    message["stop_reason"], message["stop_sequence"] = _stop_reason(choice, reply), choice.stop_string
    return json_response(message)


def _arguments(arguments: str) -> dict:
    """A call's input: an object (the grammar makes it one; {} if the model wrote none)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Blocks(Blocks):
    """Content blocks, each as content_block_start, its deltas, content_block_stop."""

    def __init__(self):
        super().__init__()
        self.index = -1

    def open(self, kind: str, call: ToolCallDelta | None) -> list[bytes]:
        self.index += 1
        block = _block(kind, "" if call is None else call)
        return [sse_event("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})]

    def delta(self, kind: str, text: str) -> list[bytes]:
        type_, key = _DELTA[kind]
        return [sse_event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": {"type": type_, key: text}})]

    def close(self) -> list[bytes]:
        return [sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]


class _Stream(lifecycle.Stream):
    """message_start, ping, per block start/deltas/stop, message_delta, message_stop; pings while the reply waits."""

    ping = _PING

    def __init__(self, gen: Generation, reply: Reply, model: str):
        self.gen, self.reply, self.model = gen, reply, model
        self.blocks = _Blocks()

    def start(self) -> bytes:
        start = _message(self.gen, self.model)
        start["usage"]["output_tokens"] = 0
        return sse_event("message_start", {"type": "message_start", "message": start}) + _PING

    def piece(self, choice: Choice, text: str | None) -> bytes:
        return b"".join(self.blocks.feed(self.reply.feed(text)))

    def end(self) -> bytes:
        choice = self.gen.choices[0]
        delta = {"stop_reason": _stop_reason(choice, self.reply), "stop_sequence": choice.stop_string}
        # Cumulative, as Anthropic sends it: the cache's hit is known only once the prompt was read, after message_start.
        end = [sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(self.gen)})]
        return b"".join([*self.blocks.end(), *end, sse_event("message_stop", {"type": "message_stop"})])

    def error(self, e: ApiError) -> bytes:
        return sse_event("error", error_body(_PATH, e))


async def count_tokens(request: Request) -> Response:
    body = await decode_body(request, CountTokensRequest)
    return json_response({"input_tokens": len(chat.prompt(await model_state(request, body.model), chat_request(body)).tokens)})


operations = [
    Operation(
        "POST", "/v1/messages", messages, "Anthropic: messages",
        body=MessagesRequest, response=dict, events=str, errors=GENERATE_ERRORS,
    ),
    Operation("POST", "/v1/messages/count_tokens", count_tokens, "Anthropic: count a conversation's tokens", body=CountTokensRequest, response=dict),
]
