"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Codex CLI and the OpenAI Agents SDK speak it. Like /v1/messages the route
only translates: input items become chat-template messages (frontend_proc.chat),
the request goes down the one generation path, and the reply comes back as
output items (reasoning, message, function_call), whole or as the API's
numbered stream of events. Tools are planned and their calls read as on the
OpenAI chat route (frontend_proc.tools, frontend_proc.tool_parser). A stored response (store, the default) lets the next request continue
its conversation with `previous_response_id` (frontend_proc.response_store).
"""

from __future__ import annotations

import json
import secrets
import time

import msgspec

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.protocol import SamplingParams
from frontend_proc import generation
from frontend_proc.app import AppState, decode_body, model_state, sse_event, sse_response, state
from frontend_proc.chat import (
    CALL,
    CONTENT,
    ChatPrompt,
    Reply,
    constraint,
    invalid,
    join,
    not_text,
    output_grammar,
    render,
    reply_parts,
    template_context,
    tool_plan,
)
from frontend_proc.cllm_api import GENERATE_ERRORS
from cllm.core.errors import ApiError, error_body, json_response
from frontend_proc.generation import Generation
from frontend_proc.openai_schemas import JsonObjectFormat, JsonSchema, JsonSchemaFormat
from frontend_proc.openapi import Operation
from frontend_proc.reasoning import REASONING
from frontend_proc.response_store import Stored
from frontend_proc.responses_schemas import (
    FormatJsonObject,
    FormatJsonSchema,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputFile,
    InputImage,
    MessageItem,
    Refusal,
    ResponsesRequest,
    item,
)
from frontend_proc.tool_parser import ToolCall, ToolCallDelta
from frontend_proc.tools import Tool, ToolPlan

_PATH = "/v1/responses"


def _text(content: str | list, param: str) -> str:
    if isinstance(content, str):
        return content
    for i, part in enumerate(content):
        if isinstance(part, (InputImage, InputFile)):
            raise not_text("image" if isinstance(part, InputImage) else "file", f"{param}[{i}]")
    return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in content)


def input_messages(input_: str | list) -> list[dict]:
    """The input items as chat-template messages (function calls as tool_calls, their outputs as tool messages)."""
    if isinstance(input_, str):
        return [{"role": "user", "content": input_}]
    out: list[dict] = []
    for i, raw in enumerate(input_):
        param = f"input[{i}]"
        it = item(raw, param)
        if isinstance(it, MessageItem):
            role = "system" if it.role == "developer" else it.role
            out.append({"role": role, "content": _text(it.content, f"{param}.content")})
        elif isinstance(it, FunctionCallItem):
            call = _template_call(it.call_id, it.name, it.arguments)
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        elif isinstance(it, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": it.call_id, "content": _text(it.output, f"{param}.output")})
    return out


def _grammar(st: AppState, body: ResponsesRequest) -> str | None:
    fmt = body.text.format if body.text else None
    if isinstance(fmt, FormatJsonSchema):
        return output_grammar(st, JsonSchemaFormat(JsonSchema(name=fmt.name, schema=fmt.schema)), "text.format")
    return output_grammar(st, JsonObjectFormat(), "text.format") if isinstance(fmt, FormatJsonObject) else None


def _response(rid: str, body: ResponsesRequest, model: str) -> dict:
    """The response object as it starts: in progress, no output yet."""
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "store": body.store,
        "temperature": body.temperature,
        "text": {"format": {"type": "text"}} if body.text is None else _encoded(body.text),
        "tool_choice": body.tool_choice if isinstance(body.tool_choice, str) else _encoded(body.tool_choice),
        "tools": [_encoded(t) for t in body.tools or ()],
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": body.metadata or {},
    }


def _encoded(struct) -> dict:
    return msgspec.to_builtins(struct)


def _item(rid: str, index: int, kind: str, text: str, status: str, call: ToolCall | ToolCallDelta | None = None) -> dict:
    """An output item: reasoning, a message with one output_text part, or a function call."""
    if kind == REASONING:
        return {"id": f"rs_{rid[5:]}_{index}", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}
    if kind == CALL:
        return {"id": f"fc_{rid[5:]}_{index}", "type": "function_call", "status": status, "call_id": call.id, "name": call.name, "arguments": text}
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": f"msg_{rid[5:]}_{index}", "type": "message", "status": status, "role": "assistant", "content": [part]}


def _finish(st: AppState, response: dict, gen: Generation, output: list[dict], conversation: list[dict]) -> None:
    """Fill in how it ended and store it (if asked to) with the conversation and the reply."""
    choice = gen.choices[0]
    incomplete = choice.finish == "length"
    response["status"] = "incomplete" if incomplete else "completed"
    response["incomplete_details"] = {"reason": "max_output_tokens"} if incomplete else None
    if incomplete and "status" in output[-1]:
        output[-1]["status"] = "incomplete"  # the item the token limit cut
    response["output"] = output
    response["output_text"] = "".join(c["text"] for o in output if o["type"] == "message" for c in o["content"])
    response["usage"] = {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": gen.cached_tokens},
        "output_tokens": gen.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": _reasoning_tokens(st, gen, output)},
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
    }
    if response["store"]:
        reply = {"role": "assistant", "content": response["output_text"]}
        calls = [_template_call(o["call_id"], o["name"], o["arguments"]) for o in output if o["type"] == "function_call"]
        if calls:
            reply["tool_calls"] = calls
        st.responses.put(response["id"], Stored(response, [*conversation, reply]))


def _reasoning_tokens(st: AppState, gen: Generation, output: list[dict]) -> int:
    """The tokens of the reasoning text, counted once the reply is over (0, at no cost, without reasoning)."""
    text = "".join(c["text"] for o in output if o["type"] == "reasoning" for c in o["content"])
    if not text:
        return 0
    return min(len(st.tokenizer.encode(text, add_special=False, parse_special=False)), gen.completion_tokens)


def _template_call(call_id: str, name: str, arguments: str) -> dict:
    """A call as templates expect it: the arguments as an object when they are JSON (transformers, llama.cpp)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        args = arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _tool_plan(st: AppState, body: ResponsesRequest) -> ToolPlan | None:
    choice = body.tool_choice if isinstance(body.tool_choice, str) else body.tool_choice.name
    if not body.tools:
        if choice != "auto" and choice != "none":
            raise invalid("tool_choice asks for a tool call, but the request has no tools", "tool_choice")
        return None
    tools = [Tool(t.name, t.description, json.dumps(t.parameters or {"type": "object", "properties": {}})) for t in body.tools]
    return tool_plan(st, tools, choice, body.parallel_tool_calls is not False, "tools")


async def create(request: Request) -> Response:
    body = await decode_body(request, ResponsesRequest)
    st = await model_state(request, body.model)  # its responses are the one store every model shares
    info = generation.engine_info(st)
    conversation: list[dict] = []
    if body.previous_response_id is not None:
        previous = st.responses.get(body.previous_response_id)
        if previous is None:
            raise ApiError(404, "not found", f"no stored response has the id {body.previous_response_id!r}", param="previous_response_id")
        conversation = list(previous.messages)
    conversation += input_messages(body.input)
    if not conversation:
        raise invalid("input is empty", "input")
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    effort = body.reasoning.effort if body.reasoning else None
    plan = _tool_plan(st, body)
    prompt = ChatPrompt(st, render(st.chat_template, system + conversation, template_context(effort=effort), "input", plan), plan)
    grammar, triggers = constraint(_grammar(st, body), plan, body.ignore_eos, "text.format")
    sampling = SamplingParams(
        max_tokens=body.max_output_tokens or info.seq_ctx,  # default: what the sequence holds
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed, ignore_eos=body.ignore_eos,
        grammar=grammar, grammar_triggers=triggers,
    )
    gen = await prompt.start(st, sampling, stream=body.stream, param="input")
    response = _response(f"resp_{secrets.token_hex(12)}", body, st.model_id)
    if body.stream:
        return sse_response(_events(st, gen, prompt.reply(), response, conversation))
    try:
        (text,) = await gen.texts(request)
    finally:
        gen.close()
    reply = prompt.reply()
    parts = reply.whole(text)
    output: list[dict] = []
    if reasoning := join(parts, REASONING):
        output.append(_item(response["id"], 0, REASONING, reasoning, "completed"))
    answer = join(parts, CONTENT)
    if answer.strip() or not reply.calls:  # every response has a message, unless it calls tools
        output.append(_item(response["id"], len(output), CONTENT, answer, "completed"))
    for call in reply.calls:
        output.append(_item(response["id"], len(output), CALL, call.arguments, "completed", call))
    _finish(st, response, gen, output, conversation)
    return json_response(response)


class _Events:
    """The stream's events, numbered as the API wants."""

    def __init__(self):
        self.seq = 0

    def __call__(self, type_: str, **fields) -> bytes:
        self.seq += 1
        return sse_event(type_, {"type": type_, "sequence_number": self.seq - 1, **fields})


_DELTA = {REASONING: "response.reasoning_text.delta", CONTENT: "response.output_text.delta", CALL: "response.function_call_arguments.delta"}


async def _events(st: AppState, gen: Generation, reply: Reply, response: dict, conversation: list[dict]):
    """created, in_progress, per item added/deltas/done, then completed (or incomplete)."""
    ev = _Events()
    rid = response["id"]
    output: list[dict] = []
    texts: list[str] = []  # of the open item

    def open_item(kind: str, call: ToolCallDelta | None) -> list[bytes]:
        index = len(output)
        new = _item(rid, index, kind, "", "in_progress", call)
        if kind == CONTENT:
            new["content"] = []
        output.append(new)
        out = [ev("response.output_item.added", output_index=index, item=new)]
        if kind == CONTENT:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(ev("response.content_part.added", item_id=new["id"], output_index=index, content_index=0, part=part))
        return out

    def close_item() -> list[bytes]:
        index, item = len(output) - 1, output[-1]
        text = "".join(texts)
        texts.clear()
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            item.update(arguments=text, status="completed")
            out = [ev("response.function_call_arguments.done", **ids, name=item["name"], arguments=text)]
        elif item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            out = [ev("response.reasoning_text.done", **ids, content_index=0, text=text)]
        else:
            item.update(_item(rid, index, CONTENT, text, "completed"))
            out = [
                ev("response.output_text.done", **ids, content_index=0, text=text, logprobs=[]),
                ev("response.content_part.done", **ids, content_index=0, part=item["content"][0]),
            ]
        return [*out, ev("response.output_item.done", output_index=index, item=item)]

    try:
        yield ev("response.created", response=response) + ev("response.in_progress", response=response)
        kind = None
        async for parts in reply_parts(gen, reply):
            out: list[bytes] = []
            for part_kind, part in parts:
                if part_kind != kind or (kind == CALL and part.id is not None):
                    if kind is not None:
                        out += close_item()
                    kind = part_kind
                    out += open_item(kind, part if kind == CALL else None)
                text = part.arguments if kind == CALL else part
                if not text:
                    continue
                texts.append(text)
                ids = {"item_id": output[-1]["id"], "output_index": len(output) - 1}
                if kind == CONTENT:
                    out.append(ev(_DELTA[kind], **ids, content_index=0, delta=text, logprobs=[]))
                else:
                    out.append(ev(_DELTA[kind], **ids, **({"content_index": 0} if kind == REASONING else {}), delta=text))
            if out:
                yield b"".join(out)
        if gen.choices[0].finish == "error":
            raise generation.engine_refused()
        out = close_item() if kind is not None else []
        if not any(o["type"] in ("message", "function_call") for o in output):  # every response has a message, unless it calls tools
            out += open_item(CONTENT, None) + close_item()
        _finish(st, response, gen, output, conversation)
        out.append(ev(f"response.{response['status']}", response=response))
        yield b"".join(out)
    except ApiError as e:  # the status line is sent: say what went wrong in the stream
        detail = error_body(_PATH, e).error
        yield ev("error", code=detail.code, message=detail.message, param=detail.param)
    finally:
        gen.close()


def _stored(request: Request) -> Stored:
    rid = request.path_params["response_id"]
    stored = state(request).responses.get(rid)
    if stored is None:
        raise ApiError(404, "not found", f"no stored response has the id {rid!r}", param="response_id")
    return stored


async def retrieve(request: Request) -> Response:
    return json_response(_stored(request).response)


async def delete(request: Request) -> Response:
    rid = _stored(request).response["id"]
    state(request).responses.delete(rid)
    return json_response({"id": rid, "object": "response.deleted", "deleted": True})


operations = [
    Operation(
        "POST", "/v1/responses", create, "OpenAI: responses",
        body=ResponsesRequest, response=dict, events=str, errors=GENERATE_ERRORS,
    ),
    Operation("GET", "/v1/responses/{response_id}", retrieve, "OpenAI: a stored response", response=dict, errors=(404,)),
    Operation("DELETE", "/v1/responses/{response_id}", delete, "OpenAI: delete a stored response", response=dict, errors=(404,)),
]
