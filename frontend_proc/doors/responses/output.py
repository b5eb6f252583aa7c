"""The response object of the Responses API and its output items; a finished one stored for what follows."""

from __future__ import annotations

import time

import msgspec

from frontend_proc.chat import chat
from frontend_proc.chat.reply import CALL, REASONING
from frontend_proc.chat.request import template_call
from frontend_proc.chat.tool_parser import ToolCall, ToolCallDelta
from frontend_proc.core.generation import Generation
from frontend_proc.core.state import ModelState
from frontend_proc.doors.responses.schemas import ResponsesRequest
from frontend_proc.doors.responses.store import ResponseStore, Stored


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
        "output_tokens_details": {"reasoning_tokens": chat.reasoning_tokens(st, gen, reasoning)},
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
    }
    if response["store"]:
        reply = {"role": "assistant", "content": response["output_text"]}
        calls = [template_call(o["call_id"], o["name"], o["arguments"]) for o in output if o["type"] == "function_call"]
        if calls:
            reply["tool_calls"] = calls
        store.put(response["id"], Stored(response, [*conversation, reply]))
