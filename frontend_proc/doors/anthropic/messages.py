"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

Claude Code and the `anthropic` SDK speak it. A door: the request is read
into a ChatRequest for the chat layer (frontend_proc.chat.turn), and the reply's
parts (frontend_proc.chat.reply) are written as content blocks (thinking, text,
tool_use), whole or as Anthropic's stream of events (frontend_proc.http.lifecycle).
Errors take Anthropic's shape (errors.py).
"""

from __future__ import annotations

import json
from typing import cast

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import invalid
from frontend_proc.chat import turn
from frontend_proc.chat.images import Image, from_base64, from_url
from frontend_proc.chat.reply import CALL, CONTENT
from frontend_proc.chat.request import ChatRequest, Fields, not_text, template_call
from frontend_proc.chat.tools import Tool
from frontend_proc.core.output import JsonOutput
from frontend_proc.core.sampling import REST
from frontend_proc.doors.anthropic.schemas import (
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    MessagesRequest,
    TextBlock,
    ThinkingDisabled,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from frontend_proc.doors.anthropic.schemas import Tool as ToolDef
from frontend_proc.doors.anthropic.writer import Stream, arguments, content_block, message_object, stop_reason
from frontend_proc.http import lifecycle
from frontend_proc.http.app import model_state
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation

_PATH = "/v1/messages"
_FIELDS = Fields(output="output_config.format", tool_schema="tools[{}]")


def _image(block: ImageBlock, param: str) -> Image:
    """An image block's source: base64 (with its media type) or a URL; a file id has nothing to read here."""
    source, param = block.source, f"{param}.source"
    kind = source.get("type")
    if kind == "base64":
        return from_base64(source.get("data"), f"{param}.data", source.get("media_type"))
    if kind == "url" and isinstance(url := source.get("url"), str):
        return from_url(url, f"{param}.url")
    raise invalid(f"an image source of type {kind!r} cannot be read here: send base64 (or a url)", f"{param}.type")


def _content(blocks: str | list, param: str, joiner: str = "") -> str | list:
    """A message's text (its text blocks joined with ``joiner``), or beside images the chat layer's list of texts
    and images; thinking and tool blocks are left to the caller, documents refused."""
    if isinstance(blocks, str):
        return blocks
    parts: list = []
    for i, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            if parts and isinstance(parts[-1], str):
                parts[-1] += joiner + block.text
            else:
                parts.append(block.text)
        elif isinstance(block, ImageBlock):
            parts.append(_image(block, f"{param}[{i}]"))
        elif isinstance(block, DocumentBlock):
            raise not_text("document", f"{param}[{i}]")
    if all(isinstance(p, str) for p in parts):
        return "".join(parts)
    return parts


def template_messages(body: CountTokensRequest) -> list[dict]:
    """Anthropic's conversation as chat-template messages (tool_use as tool_calls, tool_result as tool messages)."""
    out: list[dict] = []
    if body.system:
        system = body.system
        out.append({"role": "system", "content": system if isinstance(system, str) else _content(system, "", "\n")})
    for i, message in enumerate(body.messages):
        param = f"messages[{i}].content"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        calls = []
        for j, block in enumerate(message.content):
            if isinstance(block, ToolUseBlock):
                calls.append(template_call(block.id, block.name, block.input))
            elif isinstance(block, ToolResultBlock):
                content = _content(block.content, f"{param}[{j}].content", "\n")
                out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
            # thinking blocks of earlier turns are not sent back to the model, as Anthropic's own API does
        content = _content(message.content, param)
        if content or calls or not message.content:
            entry = {"role": message.role, "content": content}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
    return out


def chat_request(body: CountTokensRequest, max_tokens: int = REST) -> ChatRequest:
    """max_tokens: /v1/messages's (count_tokens samples nothing)."""
    choice = body.tool_choice
    fmt = body.output_config.format if body.output_config else None
    tools = cast("list[ToolDef]", body.tools or [])  # Structs once decoded (CountTokensRequest.__post_init__)
    named: dict[type, str] = {ToolChoiceAny: "required", ToolChoiceNone: "none"}
    return ChatRequest(
        messages=template_messages(body),
        sampling=body.params(max_tokens),
        tools=[Tool(t.name, t.description, json.dumps(t.input_schema)) for t in tools],
        tool_choice=choice.name if isinstance(choice, ToolChoiceTool) else named.get(type(choice), "auto"),
        parallel_tool_calls=choice is None or not getattr(choice, "disable_parallel_tool_use", False),
        output=JsonOutput(fmt.schema) if fmt else None,
        thinking=None if body.thinking is None else not isinstance(body.thinking, ThinkingDisabled),
        effort=body.output_config.effort if body.output_config else None,
        fields=_FIELDS,
    )


async def messages(request: Request) -> Response:
    body = await decode_body(request, MessagesRequest)
    st = await model_state(request, body.model)
    req = chat_request(body, body.max_tokens)
    req.stops, req.stream = body.stop_sequences or (), body.stream
    prompt = await turn.prompt(st, req)
    gen = await turn.start(st, req, prompt)
    if body.stream:
        return lifecycle.stream(gen, Stream(gen, prompt.reply(), st.model_id))
    (text,) = await lifecycle.whole(request, gen)
    choice, reply = gen.choices[0], prompt.reply()
    message = message_object(gen, st.model_id)
    parts = reply.whole(text)
    blocks = [
        content_block(kind, part)
        for kind, part in parts
        if kind != CALL and not (reply.calls and kind == CONTENT and not part.strip())
    ]
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": arguments(c.arguments)} for c in reply.calls]
    message["content"] = blocks
    message["stop_reason"], message["stop_sequence"] = stop_reason(choice, reply), choice.stop_string
    return json_response(message)


async def count_tokens(request: Request) -> Response:
    body = await decode_body(request, CountTokensRequest)
    prompt = await turn.prompt(await model_state(request, body.model), chat_request(body))
    return json_response({"input_tokens": prompt.positions})


operations = [
    Operation(
        "POST",
        "/v1/messages",
        messages,
        "Anthropic: messages",
        body=MessagesRequest,
        response=dict,
        events=str,
        errors=GENERATE_ERRORS,
    ),
    Operation(
        "POST",
        "/v1/messages/count_tokens",
        count_tokens,
        "Anthropic: count a conversation's tokens",
        body=CountTokensRequest,
        response=dict,
    ),
]
