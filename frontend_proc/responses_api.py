"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Codex CLI and the OpenAI Agents SDK speak it. Like /v1/messages the route
only translates: input items become chat-template messages (frontend_proc.chat),
the request goes down the one generation path, and the reply comes back as
output items (reasoning, message), whole or as the API's numbered stream of
events. A stored response (store, the default) lets the next request continue
its conversation with `previous_response_id` (frontend_proc.response_store).
"""

from __future__ import annotations

import secrets
import time

import msgspec

from starlette.requests import Request
from starlette.responses import Response

from cllm.protocol import SamplingParams
from frontend_proc import generation
from frontend_proc.app import AppState, decode_body, sse_event, sse_response, state
from frontend_proc.chat import ChatPrompt, invalid, join, not_text, output_grammar, template_context
from frontend_proc.cllm_api import GENERATE_ERRORS
from frontend_proc.errors import ApiError, error_body, json_response
from frontend_proc.generation import Generation
from frontend_proc.openai_api import model_id
from frontend_proc.openai_schemas import JsonObjectFormat, JsonSchema, JsonSchemaFormat
from frontend_proc.openapi import Operation
from frontend_proc.reasoning import CONTENT, REASONING
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
            call = {"id": it.call_id, "type": "function", "function": {"name": it.name, "arguments": it.arguments}}
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


def _item(rid: str, index: int, kind: str, text: str, status: str) -> dict:
    if kind == REASONING:
        return {"id": f"rs_{rid[5:]}_{index}", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": f"msg_{rid[5:]}_{index}", "type": "message", "status": status, "role": "assistant", "content": [part]}


def _finish(st: AppState, response: dict, gen: Generation, output: list[dict], conversation: list[dict]) -> None:
    """Fill in how it ended and store it (if asked to) with the conversation and the reply."""
    choice = gen.choices[0]
    incomplete = choice.finish == "length"
    response["status"] = "incomplete" if incomplete else "completed"
    response["incomplete_details"] = {"reason": "max_output_tokens"} if incomplete else None
    if incomplete:
        output[-1]["status"] = "incomplete"  # the message, which the token limit cut
    response["output"] = output
    response["output_text"] = "".join(c["text"] for o in output if o["type"] == "message" for c in o["content"])
    response["usage"] = {
        "input_tokens": gen.prompt_tokens,
        "output_tokens": gen.completion_tokens,
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
    }
    if response["store"]:
        reply = {"role": "assistant", "content": response["output_text"]}
        st.responses.put(response["id"], Stored(response, [*conversation, reply]))


async def create(request: Request) -> Response:
    st = state(request)
    body = await decode_body(request, ResponsesRequest)
    if body.tools:
        raise invalid("tools are not supported yet", "tools")
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
    prompt = ChatPrompt(st, system + conversation, template_context(effort=effort), "input")
    grammar = _grammar(st, body)
    if grammar is not None and body.ignore_eos:  # the grammar's end can only be followed by an end-of-generation token
        raise invalid("ignore_eos cannot be combined with a JSON text.format", "ignore_eos")
    sampling = SamplingParams(
        max_tokens=body.max_output_tokens or info.seq_ctx,  # default: what the sequence holds
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed, ignore_eos=body.ignore_eos, grammar=grammar,
    )
    gen = await generation.start(st, [prompt.tokens], sampling, stream=body.stream, prompt_param="input")
    response = _response(f"resp_{secrets.token_hex(12)}", body, model_id(info))
    if body.stream:
        return sse_response(_events(st, gen, prompt, response, conversation))
    try:
        (text,) = await gen.texts(request)
    finally:
        gen.close()
    parts = prompt.split(text)
    output = [_item(response["id"], i, kind, join(parts, kind), "completed") for i, kind in enumerate(_kinds(parts))]
    _finish(st, response, gen, output, conversation)
    return json_response(response)


def _kinds(parts: list[tuple[str, str]]) -> list[str]:
    """The output items a reply makes: its reasoning, if any, then always a message."""
    return [REASONING, CONTENT] if any(kind == REASONING for kind, _ in parts) else [CONTENT]


class _Events:
    """The stream's events, numbered as the API wants."""

    def __init__(self):
        self.seq = 0

    def __call__(self, type_: str, **fields) -> bytes:
        self.seq += 1
        return sse_event(type_, {"type": type_, "sequence_number": self.seq - 1, **fields})


async def _events(st: AppState, gen: Generation, prompt: ChatPrompt, response: dict, conversation: list[dict]):
    """created, in_progress, per item added/deltas/done, then completed (or incomplete)."""
    ev = _Events()
    rid = response["id"]
    output: list[dict] = []
    texts: list[str] = []  # of the open item

    def open_item(kind: str) -> list[bytes]:
        index = len(output)
        new = _item(rid, index, kind, "", "in_progress")
        if kind == CONTENT:
            new["content"] = []
        output.append(new)
        out = [ev("response.output_item.added", output_index=index, item=new)]
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []} if kind == CONTENT else None
        if part is not None:
            out.append(ev("response.content_part.added", item_id=new["id"], output_index=index, content_index=0, part=part))
        return out

    def close_item() -> list[bytes]:
        index, kind = len(output) - 1, output[-1]["type"]
        text = "".join(texts)
        texts.clear()
        done = _item(rid, index, REASONING if kind == "reasoning" else CONTENT, text, "completed")
        output[index] = done
        ids = {"item_id": done["id"], "output_index": index, "content_index": 0}
        if kind == "reasoning":
            out = [ev("response.reasoning_text.done", **ids, text=text)]
        else:
            out = [ev("response.output_text.done", **ids, text=text, logprobs=[]), ev("response.content_part.done", **ids, part=done["content"][0])]
        return [*out, ev("response.output_item.done", output_index=index, item=done)]

    try:
        yield ev("response.created", response=response) + ev("response.in_progress", response=response)
        kind = None
        async for parts in prompt.parts(gen):
            out: list[bytes] = []
            for part_kind, text in parts:
                if part_kind != kind:
                    if kind is not None:
                        out += close_item()
                    kind = part_kind
                    out += open_item(kind)
                texts.append(text)
                ids = {"item_id": output[-1]["id"], "output_index": len(output) - 1, "content_index": 0}
                if kind == REASONING:
                    out.append(ev("response.reasoning_text.delta", **ids, delta=text))
                else:
                    out.append(ev("response.output_text.delta", **ids, delta=text, logprobs=[]))
            if out:
                yield b"".join(out)
        if gen.choices[0].finish == "error":
            raise generation.engine_refused()
        out = close_item() if kind is not None else []
        if kind != CONTENT:  # every response has a message, if an empty one
            out += open_item(CONTENT) + close_item()
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
