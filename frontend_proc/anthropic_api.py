"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

Claude Code and the `anthropic` SDK speak it. The route only translates: the
conversation becomes the messages chat templates know (frontend_proc.chat),
the request goes down the one generation path (frontend_proc.generation), and
the reply comes back as content blocks (thinking, text, tool_use), whole or
as Anthropic's stream of events. Tools are planned and their calls read as on
the OpenAI route (frontend_proc.tools, frontend_proc.tool_parser). Errors take Anthropic's shape (errors.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.protocol import SamplingParams
from frontend_proc import generation
from frontend_proc.anthropic_schemas import (
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
from frontend_proc.app import AppState, decode_body, model_state, sse_event, sse_response
from frontend_proc.chat import (
    CALL,
    CONTENT,
    ChatPrompt,
    Reply,
    constraint,
    invalid,
    not_text,
    output_grammar,
    render,
    reply_parts,
    template_context,
    tool_plan,
)
from frontend_proc.cllm_api import GENERATE_ERRORS
from cllm.core.errors import ApiError, error_body, json_response
from frontend_proc.generation import Choice, Generation
from frontend_proc.openai_schemas import JsonSchema, JsonSchemaFormat
from frontend_proc.openapi import Operation
from frontend_proc.reasoning import REASONING
from frontend_proc.tools import Tool, ToolPlan

_PATH = "/v1/messages"
PING_SECONDS = 5.0  # between pings while a stream waits for its first token, as Anthropic keeps idle streams alive
_PING = sse_event("ping", {"type": "ping"})


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
                calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": block.input}})
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


def _tool_plan(st: AppState, body: CountTokensRequest) -> ToolPlan | None:
    choice = body.tool_choice
    if not body.tools:
        if isinstance(choice, (ToolChoiceAny, ToolChoiceTool)):
            raise invalid("tool_choice asks for a tool call, but the request has no tools", "tool_choice")
        return None
    tools = [Tool(t.name, t.description, json.dumps(t.input_schema)) for t in body.tools]
    name = {ToolChoiceAny: "required", ToolChoiceTool: getattr(choice, "name", None), ToolChoiceNone: "none"}.get(type(choice), "auto")
    parallel = choice is None or not getattr(choice, "disable_parallel_tool_use", False)
    return tool_plan(st, tools, name, parallel, "tools")


def _prompt(st: AppState, body: CountTokensRequest) -> ChatPrompt:
    thinking = None if body.thinking is None else not isinstance(body.thinking, ThinkingDisabled)
    effort = body.output_config.effort if body.output_config else None
    plan = _tool_plan(st, body)
    text = render(st.chat_template, template_messages(body), template_context(thinking, effort), "messages", plan)
    return ChatPrompt(st, text, plan)


def _sampling(st: AppState, body: MessagesRequest, plan: ToolPlan | None) -> SamplingParams:
    fmt = body.output_config.format if body.output_config else None
    output = output_grammar(st, JsonSchemaFormat(JsonSchema("output", fmt.schema)) if fmt else None, "output_config.format")
    grammar, triggers = constraint(output, plan, body.ignore_eos, "output_config.format")
    return SamplingParams(
        max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed,
        ignore_eos=body.ignore_eos, grammar=grammar, grammar_triggers=triggers,
    )


def _stop_reason(choice: Choice, reply: Reply) -> str:
    if choice.finish == "length":
        return "max_tokens"
    if reply.calls:
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


def _delta(kind: str, part) -> dict:
    if kind == REASONING:
        return {"type": "thinking_delta", "thinking": part}
    if kind == CALL:
        return {"type": "input_json_delta", "partial_json": part.arguments}
    return {"type": "text_delta", "text": part}


async def messages(request: Request) -> Response:
    body = await decode_body(request, MessagesRequest)
    st = await model_state(request, body.model)
    prompt = _prompt(st, body)
    stops = body.stop_sequences or ()
    gen = await prompt.start(st, _sampling(st, body, prompt.tool_plan), stops=stops, stream=body.stream, param="messages")
    if body.stream:
        return sse_response(_events(gen, prompt, st.model_id))
    try:
        (text,) = await gen.texts(request)
    finally:
        gen.close()
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


async def _first(parts: AsyncIterator[list[tuple]]) -> AsyncIterator[bytes | list[tuple]]:
    """Pings every PING_SECONDS until the first piece of the reply comes (queued, or a long prefill), then that piece.

    Only the wait for the first piece is watched: every later one is awaited
    as it is, so the pings cost nothing per token.
    """
    first = asyncio.ensure_future(anext(parts, []))
    try:
        while not (await asyncio.wait((first,), timeout=PING_SECONDS))[0]:
            yield _PING
        yield first.result()
    finally:
        first.cancel()


async def _events(gen: Generation, prompt: ChatPrompt, model: str):
    """message_start, ping, per block start/deltas/stop, message_delta, message_stop; pings while the reply waits."""
    choice, reply = gen.choices[0], prompt.reply()
    index, kind = -1, None  # the open block

    def events(parts: list[tuple]) -> bytes:
        nonlocal index, kind
        out = []
        for part_kind, part in parts:
            opens = part_kind != kind or (kind == CALL and part.id is not None)
            if opens:
                if kind is not None:
                    out.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))
                index, kind = index + 1, part_kind
                block = _block(kind, "" if kind != CALL else part)
                out.append(sse_event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
            if kind != CALL or part.arguments:
                delta = {"type": "content_block_delta", "index": index, "delta": _delta(kind, part)}
                out.append(sse_event("content_block_delta", delta))
        return b"".join(out)

    try:
        start = _message(gen, model)
        start["usage"]["output_tokens"] = 0
        yield sse_event("message_start", {"type": "message_start", "message": start}) + _PING
        parts = reply_parts(gen, reply)
        async for first in _first(parts):
            if first is _PING:
                yield _PING
            elif out := events(first):
                yield out
        async for later in parts:
            if out := events(later):
                yield out
        if choice.finish == "error":
            raise generation.engine_refused()
        end = []
        if kind is not None:
            end.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        delta = {"stop_reason": _stop_reason(choice, reply), "stop_sequence": choice.stop_string}
        # Cumulative, as Anthropic sends it: the cache's hit is known only once the prompt was read, after message_start.
        end.append(sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(gen)}))
        end.append(sse_event("message_stop", {"type": "message_stop"}))
        yield b"".join(end)
    except ApiError as e:  # the status line is sent: say what went wrong in the stream
        yield sse_event("error", error_body(_PATH, e))
    finally:
        gen.close()


async def count_tokens(request: Request) -> Response:
    body = await decode_body(request, CountTokensRequest)
    return json_response({"input_tokens": len(_prompt(await model_state(request, body.model), body).tokens)})


operations = [
    Operation(
        "POST", "/v1/messages", messages, "Anthropic: messages",
        body=MessagesRequest, response=dict, events=str, errors=GENERATE_ERRORS,
    ),
    Operation("POST", "/v1/messages/count_tokens", count_tokens, "Anthropic: count a conversation's tokens", body=CountTokensRequest, response=dict),
]
