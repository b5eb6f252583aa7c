"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Codex CLI and the OpenAI Agents SDK speak it. A door, like /v1/messages: input
items are read into a ChatRequest for the chat layer (frontend_proc.chat.turn), and
the reply's parts (frontend_proc.chat.reply) are written as output items
(reasoning, message, function_call), whole or as the API's numbered stream of
events (frontend_proc.http.lifecycle). A stored response (store, the default) lets
the next request continue its conversation with `previous_response_id`
(frontend_proc.doors.responses.store).
"""

from __future__ import annotations

import secrets
from typing import cast

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError, invalid
from frontend_proc.chat import turn
from frontend_proc.chat.images import Image, from_url
from frontend_proc.chat.reply import CALL, CONTENT, REASONING, join
from frontend_proc.chat.request import ChatRequest, Fields, not_text, template_call, tool
from frontend_proc.core.output import JsonOutput
from frontend_proc.core.sampling import REST
from frontend_proc.doors.responses.schemas import (
    FormatJsonObject,
    FormatJsonSchema,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputFile,
    InputImage,
    MessageItem,
    Refusal,
    ResponsesRequest,
    item,
)
from frontend_proc.doors.responses.store import Stored, store
from frontend_proc.doors.responses.writer import Stream, finish, output_item, response_object
from frontend_proc.http import lifecycle
from frontend_proc.http.app import model_state
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation

_FIELDS = Fields(messages="input", output="text.format", tool_schema="tools[{}]", max_tokens="max_output_tokens")


def _image(part: InputImage, param: str) -> Image:
    if part.image_url is not None:
        return from_url(part.image_url, f"{param}.image_url")
    if part.file_id is not None:
        raise invalid("this server has no Files API: send the image as image_url (a data URI)", f"{param}.file_id")
    raise invalid("an input_image needs image_url (a data URI)", f"{param}.image_url")


def _text(content: str | list, param: str) -> str | list:
    """The parts' text, or beside images the chat layer's list of texts and images."""
    if isinstance(content, str):
        return content
    parts: list = []
    for i, part in enumerate(content):
        if isinstance(part, InputFile):
            raise not_text("file", f"{param}[{i}]")
        if isinstance(part, InputImage):
            parts.append(_image(part, f"{param}[{i}]"))
        elif parts and isinstance(parts[-1], str):
            parts[-1] += part.refusal if isinstance(part, Refusal) else part.text
        else:
            parts.append(part.refusal if isinstance(part, Refusal) else part.text)
    return "".join(parts) if all(isinstance(p, str) for p in parts) else parts


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
    output = (
        JsonOutput(fmt.schema)
        if isinstance(fmt, FormatJsonSchema)
        else JsonOutput()
        if isinstance(fmt, FormatJsonObject)
        else None
    )
    return ChatRequest(
        messages=([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation,
        sampling=body.params(body.max_output_tokens or REST),
        tools=[tool(t.name, t.description, t.parameters) for t in cast("list[FunctionTool]", body.tools or [])],
        tool_choice=body.tool_choice if isinstance(body.tool_choice, str) else body.tool_choice.name,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        output=output,
        effort=body.reasoning.effort if body.reasoning else None,
        stream=body.stream,
        fields=_FIELDS,
    )


async def create(request: Request) -> Response:
    body = await decode_body(request, ResponsesRequest)
    st = await model_state(request, body.model)
    stored = store(request)  # every model's responses
    conversation: list[dict] = []
    if body.previous_response_id is not None:
        previous = stored.get(body.previous_response_id)
        if previous is None:
            raise ApiError(
                404,
                "not found",
                f"no stored response has the id {body.previous_response_id!r}",
                param="previous_response_id",
            )
        conversation = list(previous.messages)
    conversation += input_messages(body.input)
    if not conversation:
        raise invalid("input is empty", "input")
    req = chat_request(body, conversation)
    prompt = await turn.prompt(st, req)
    gen = await turn.start(st, req, prompt)
    response = response_object(f"resp_{secrets.token_hex(12)}", body, st.model_id)
    if body.stream:
        return lifecycle.stream(gen, Stream(st, stored, gen, prompt.reply(), response, conversation))
    (text,) = await lifecycle.whole(request, gen)
    reply = prompt.reply()
    parts = reply.whole(text)
    output: list[dict] = []
    if reasoning := join(parts, REASONING):
        output.append(output_item(response["id"], 0, REASONING, reasoning, "completed"))
    answer = join(parts, CONTENT)
    if answer.strip() or not reply.calls:  # every response has a message, unless it calls tools
        output.append(output_item(response["id"], len(output), CONTENT, answer, "completed"))
    for call in reply.calls:
        output.append(output_item(response["id"], len(output), CALL, call.arguments, "completed", call))
    finish(st, stored, response, gen, output, conversation)
    return json_response(response)


def _stored(request: Request) -> Stored:
    rid = request.path_params["response_id"]
    stored = store(request).get(rid)
    if stored is None:
        raise ApiError(404, "not found", f"no stored response has the id {rid!r}", param="response_id")
    return stored


async def retrieve(request: Request) -> Response:
    return json_response(_stored(request).response)


async def delete(request: Request) -> Response:
    rid = _stored(request).response["id"]
    store(request).delete(rid)
    return json_response({"id": rid, "object": "response.deleted", "deleted": True})


operations = [
    Operation(
        "POST",
        "/v1/responses",
        create,
        "OpenAI: responses",
        body=ResponsesRequest,
        response=dict,
        events=str,
        errors=GENERATE_ERRORS,
    ),
    Operation(
        "GET", "/v1/responses/{response_id}", retrieve, "OpenAI: a stored response", response=dict, errors=(404,)
    ),
    Operation(
        "DELETE",
        "/v1/responses/{response_id}",
        delete,
        "OpenAI: delete a stored response",
        response=dict,
        errors=(404,),
    ),
]
