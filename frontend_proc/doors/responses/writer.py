"""The Responses API's answer: the response object and its output items, a finished one stored for what follows,
and the numbered stream of events (created, in_progress, each output item added, its deltas and done, then completed
or incomplete)."""

from __future__ import annotations

import time
from typing import cast

import msgspec

from cllm.core.errors import ApiError
from frontend_proc.chat import turn
from frontend_proc.chat.reply import CALL, CONTENT, REASONING, Blocks, Reply
from frontend_proc.chat.request import template_call
from frontend_proc.chat.tool_parser import ToolCall, ToolCallDelta
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.core.state import ModelState
from frontend_proc.doors.responses.schemas import ResponsesRequest
from frontend_proc.doors.responses.store import ResponseStore, Stored
from frontend_proc.http import lifecycle
from frontend_proc.http.errors import OpenAIError, error_body
from frontend_proc.http.sse import sse_event

PATH = "/v1/responses"
_DELTA = {
    REASONING: "response.reasoning_text.delta",
    CONTENT: "response.output_text.delta",
    CALL: "response.function_call_arguments.delta",
}


def response_object(rid: str, body: ResponsesRequest, model: str) -> dict:
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
        "text": {"format": {"type": "text"}} if body.text is None else encoded(body.text),
        "tool_choice": body.tool_choice if isinstance(body.tool_choice, str) else encoded(body.tool_choice),
        "tools": [encoded(t) for t in body.tools or ()],
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": body.metadata or {},
    }


def encoded(struct) -> dict:
    return msgspec.to_builtins(struct)


def output_item(
    rid: str, index: int, kind: str, text: str, status: str, call: ToolCall | ToolCallDelta | None = None
) -> dict:
    """An output item: reasoning, a message with one output_text part, or a function call."""
    if kind == REASONING:
        return {
            "id": f"rs_{rid[5:]}_{index}",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        }
    if kind == CALL:
        assert call is not None  # a call's item is opened with its call
        return {
            "id": f"fc_{rid[5:]}_{index}",
            "type": "function_call",
            "status": status,
            "call_id": call.id,
            "name": call.name,
            "arguments": text,
        }
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": f"msg_{rid[5:]}_{index}", "type": "message", "status": status, "role": "assistant", "content": [part]}


def finish(
    st: ModelState, store: ResponseStore, response: dict, gen: Generation, output: list[dict], conversation: list[dict]
) -> None:
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
        "output_tokens_details": {"reasoning_tokens": turn.reasoning_tokens(st, gen, reasoning)},
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
    }
    if response["store"]:
        reply = {"role": "assistant", "content": response["output_text"]}
        calls = [template_call(o["call_id"], o["name"], o["arguments"]) for o in output if o["type"] == "function_call"]
        if calls:
            reply["tool_calls"] = calls
        store.put(response["id"], Stored(response, [*conversation, reply]))


class Items(Blocks):
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
        new = output_item(self.rid, index, kind, "", "in_progress", call)
        if kind == CONTENT:
            new["content"] = []
        self.output.append(new)
        out = [self.ev("response.output_item.added", output_index=index, item=new)]
        if kind == CONTENT:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                self.ev(
                    "response.content_part.added", item_id=new["id"], output_index=index, content_index=0, part=part
                )
            )
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
            item.update(output_item(self.rid, index, CONTENT, text, "completed"))
            out = [
                self.ev("response.output_text.done", **ids, content_index=0, text=text, logprobs=[]),
                self.ev("response.content_part.done", **ids, content_index=0, part=item["content"][0]),
            ]
        return [*out, self.ev("response.output_item.done", output_index=index, item=item)]


class Stream(lifecycle.Stream):
    """created, in_progress, per item added/deltas/done, then completed (or incomplete)."""

    def __init__(
        self,
        st: ModelState,
        store: ResponseStore,
        gen: Generation,
        reply: Reply,
        response: dict,
        conversation: list[dict],
    ):
        self.st, self.store, self.gen, self.reply, self.response, self.conversation = (
            st,
            store,
            gen,
            reply,
            response,
            conversation,
        )
        self.items = Items(response["id"])

    def start(self) -> bytes:
        ev, response = self.items.ev, self.response
        return ev("response.created", response=response) + ev("response.in_progress", response=response)

    def piece(self, choice: Choice, text: str | None) -> bytes:
        return b"".join(self.items.feed(self.reply.feed(text)))

    def end(self) -> bytes:
        items = self.items
        out = items.end()
        if not any(
            o["type"] in ("message", "function_call") for o in items.output
        ):  # every response has a message, unless it calls tools
            out += items.open(CONTENT, None) + items.close()
        finish(self.st, self.store, self.response, self.gen, items.output, self.conversation)
        out.append(items.ev(f"response.{self.response['status']}", response=self.response))
        return b"".join(out)

    def error(self, e: ApiError) -> bytes:
        detail = cast(OpenAIError, error_body(PATH, e)).error  # /v1/ answers in OpenAI's shape
        return self.items.ev("error", code=detail.code, message=detail.message, param=detail.param)
