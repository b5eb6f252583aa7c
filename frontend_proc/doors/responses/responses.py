"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Codex CLI and the OpenAI Agents SDK speak it. A door, like /v1/messages: input
items are read into a ChatRequest for the chat layer (frontend_proc.chat.chat), and
the reply's parts (frontend_proc.chat.reply) are written as output items
(reasoning, message, function_call), whole or as the API's numbered stream of
events (frontend_proc.http.lifecycle). A stored response (store, the default) lets
the next request continue its conversation with `previous_response_id`
(frontend_proc.doors.responses.store).
"""

from __future__ import annotations

import secrets
import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError, error_body, json_response
from cllm.core.protocol import SamplingParams
from frontend_proc.chat import chat
from frontend_proc.chat.reply import CALL, CONTENT, REASONING, Blocks, Reply, join
from frontend_proc.chat.request import ChatRequest, Fields, JsonOutput, invalid, not_text, template_call, tool
from frontend_proc.chat.tool_parser import ToolCall, ToolCallDelta
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.core.state import AppState
from frontend_proc.doors.responses.schemas import (
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
from frontend_proc.doors.responses.store import Stored
from frontend_proc.http import lifecycle
from frontend_proc.http.app import decode_body, model_state, sse_event, state
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation

_PATH = "/v1/responses"
_FIELDS = Fields(messages="input", output="text.format", tool_schema="tools[{}]")


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
            call = template_call(it.call_id, it.name, it.arguments)
            if not (out and out[-1]["role"] == "assistant"):
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
        elif isinstance(it, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": it.call_id, "content": _text(it.output, f"{param}.output")})
    return out


def chat_request(body: ResponsesRequest, conversation: list[dict]) -> ChatRequest:
    fmt = body.text.format if body.text else None
    output = JsonOutput(fmt.schema) if isinstance(fmt, FormatJsonSchema) else JsonOutput() if isinstance(fmt, FormatJsonObject) else None
    return ChatRequest(
        messages=([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation,
        sampling=SamplingParams(
            max_tokens=body.max_output_tokens or 0,
            temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed, ignore_eos=body.ignore_eos,
        ),
        tools=[tool(t.name, t.description, t.parameters) for t in body.tools or ()],
        tool_choice=body.tool_choice if isinstance(body.tool_choice, str) else body.tool_choice.name,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        output=output,
        effort=body.reasoning.effort if body.reasoning else None,
        stream=body.stream,
        fields=_FIELDS,
    )


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
    reasoning = "".join(c["text"] for o in output if o["type"] == "reasoning" for c in o["content"])
    response["usage"] = {
        "input_tokens": gen.prompt_tokens,
        "input_tokens_details": {"cached_tokens": gen.cached_tokens},
        "output_tokens": gen.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": chat.reasoning_tokens(st, gen, reasoning)},
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
    }
    if response["store"]:
        reply = {"role": "assistant", "content": response["output_text"]}
        calls = [template_call(o["call_id"], o["name"], o["arguments"]) for o in output if o["type"] == "function_call"]
        if calls:
            reply["tool_calls"] = calls
        st.responses.put(response["id"], Stored(response, [*conversation, reply]))


async def create(request: Request) -> Response:
    body = await decode_body(request, ResponsesRequest)
    st = await model_state(request, body.model)  # its responses are the one store every model shares
    conversation: list[dict] = []
    if body.previous_response_id is not None:
        previous = st.responses.get(body.previous_response_id)
        if previous is None:
            raise ApiError(404, "not found", f"no stored response has the id {body.previous_response_id!r}", param="previous_response_id")
        conversation = list(previous.messages)
    conversation += input_messages(body.input)
    if not conversation:
        raise invalid("input is empty", "input")
    req = chat_request(body, conversation)
    prompt = chat.prompt(st, req)
    gen = await chat.start(st, req, prompt)
    response = _response(f"resp_{secrets.token_hex(12)}", body, st.model_id)
    if body.stream:
        return lifecycle.stream(gen, _Stream(st, gen, prompt.reply(), response, conversation))
    (text,) = await lifecycle.whole(request, gen)
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


_DELTA = {REASONING: "response.reasoning_text.delta", CONTENT: "response.output_text.delta", CALL: "response.function_call_arguments.delta"}


class _Items(Blocks):
    """Output items, each as output_item.added (and a content part), its deltas, the done events; numbered."""

    def __init__(self, rid: str):
        super().__init__()
        self.rid = rid
        self.seq = 0
        self.output: list[dict] = []
        self.texts: list[str] = []  # of the open item

    def ev(self, type_: str, **fields) -> bytes:
        self.seq += 1
        return sse_event(type_, {"type": type_, "sequence_number": self.seq - 1, **fields})

    def open(self, kind: str, call: ToolCallDelta | None) -> list[bytes]:
        index = len(self.output)
        new = _item(self.rid, index, kind, "", "in_progress", call)
        if kind == CONTENT:
            new["content"] = []
        self.output.append(new)
        out = [self.ev("response.output_item.added", output_index=index, item=new)]
        if kind == CONTENT:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self.ev("response.content_part.added", item_id=new["id"], output_index=index, content_index=0, part=part))
        return out

    def delta(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        self.texts.append(text)
        ids = {"item_id": self.output[-1]["id"], "output_index": len(self.output) - 1}
        if kind == CONTENT:
            return [self.ev(_DELTA[kind], **ids, content_index=0, delta=text, logprobs=[])]
        return [self.ev(_DELTA[kind], **ids, **({"content_index": 0} if kind == REASONING else {}), delta=text)]

    def close(self) -> list[bytes]:
        index, item = len(self.output) - 1, self.output[-1]
        text = "".join(self.texts)
        self.texts.clear()
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            item.update(arguments=text, status="completed")
            out = [self.ev("response.function_call_arguments.done", **ids, name=item["name"], arguments=text)]
        elif item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            out = [self.ev("response.reasoning_text.done", **ids, content_index=0, text=text)]
        else:
            item.update(_item(self.rid, index, CONTENT, text, "completed"))
            out = [
                self.ev("response.output_text.done", **ids, content_index=0, text=text, logprobs=[]),
                self.ev("response.content_part.done", **ids, content_index=0, part=item["content"][0]),
            ]
        return [*out, self.ev("response.output_item.done", output_index=index, item=item)]


class _Stream(lifecycle.Stream):
    """created, in_progress, per item added/deltas/done, then completed (or incomplete)."""

    def __init__(self, st: AppState, gen: Generation, reply: Reply, response: dict, conversation: list[dict]):
        self.st, self.gen, self.reply, self.response, self.conversation = st, gen, reply, response, conversation
        self.items = _Items(response["id"])

    def start(self) -> bytes:
        ev, response = self.items.ev, self.response
        return ev("response.created", response=response) + ev("response.in_progress", response=response)

    def piece(self, choice: Choice, text: str | None) -> bytes:
        return b"".join(self.items.feed(self.reply.feed(text)))

    def end(self) -> bytes:
        items = self.items
        out = items.end()
        if not any(o["type"] in ("message", "function_call") for o in items.output):  # every response has a message, unless it calls tools
            out += items.open(CONTENT, None) + items.close()
        _finish(self.st, self.response, self.gen, items.output, self.conversation)
        out.append(items.ev(f"response.{self.response['status']}", response=self.response))
        return b"".join(out)

    def error(self, e: ApiError) -> bytes:
        detail = error_body(_PATH, e).error
        return self.items.ev("error", code=detail.code, message=detail.message, param=detail.param)


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
