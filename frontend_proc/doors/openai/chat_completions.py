"""OpenAI's chat completions: POST /v1/chat/completions.

A door: the body is read into a ChatRequest for the chat layer
(frontend_proc.chat.turn), and each choice's reply parts (frontend_proc.chat.reply) are
written as OpenAI's message, or as its deltas in the chunks that
frontend_proc.doors.openai.writer streams.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import invalid
from frontend_proc.chat import turn
from frontend_proc.chat.reply import CALL, CONTENT, REASONING, Reply, join
from frontend_proc.chat.request import ChatRequest, Fields, tool
from frontend_proc.core.generation import Choice
from frontend_proc.core.sampling import REST
from frontend_proc.core.state import ModelState
from frontend_proc.doors.openai.schemas import ChatCompletionRequest, MessageError
from frontend_proc.doors.openai.writer import output, respond_openai, response_head
from frontend_proc.http.app import model_state, state
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation

_FIELDS = Fields()
_NEWER_LIMIT = Fields(max_tokens="max_completion_tokens")  # the client's name, in the 400 of a limit too large


def chat_request(body: ChatCompletionRequest) -> ChatRequest:
    try:
        messages = [m.to_template(i) for i, m in enumerate(body.messages)]
    except MessageError as e:
        raise invalid(str(e), e.param) from None
    choice = body.tool_choice or "auto"
    return ChatRequest(
        messages=messages,
        sampling=body.sampling(
            body.max_completion_tokens or body.max_tokens or REST, (body.top_logprobs or 0) if body.logprobs else None
        ),
        tools=[tool(t.function.name, t.function.description, t.function.parameters) for t in body.tools or ()],
        tool_choice=choice if isinstance(choice, str) else choice.function.name,
        parallel_tool_calls=body.parallel_tool_calls,
        output=output(body),
        effort=body.reasoning_effort,
        template_kwargs=body.chat_template_kwargs,
        n=body.n,
        stops=body.stops,
        stream=body.stream,
        fields=_NEWER_LIMIT if body.max_completion_tokens else _FIELDS,
    )


def _chat_logprobs(st: ModelState, choice: Choice, start: int, end: int) -> dict:
    piece = st.tokenizer.piece

    def entry(token: int, logprob: float) -> dict:
        b = piece(token)
        return {"token": b.decode(errors="replace"), "logprob": logprob, "bytes": list(b)}

    content = []
    for token, e in zip(choice.stream.tokens[start:end], choice.stream.logprobs[start:end]):
        item = entry(token, e.logprob)
        item["top_logprobs"] = [entry(i, lp) for i, lp in zip(e.top_ids, e.top_logprobs)]
        content.append(item)
    return {"content": content, "refusal": None}


def _message(reply: Reply, text: str) -> dict:
    """The assistant message of a whole reply: its answer, its tool calls, its reasoning."""
    parts = reply.whole(text)
    content, calls = join(parts, CONTENT), reply.calls
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["content"] = content if content.strip() else None
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    if reasoning := join(parts, REASONING):
        message["reasoning_content"] = reasoning
    return message


def _deltas(parts: list[tuple]) -> list[dict]:
    """The deltas of a piece's parts: the reasoning first, then the answer and the calls as they open and fill."""
    out: list[dict] = []
    reasoning = ""
    for kind, part in parts:
        if kind == REASONING:
            reasoning += part
        elif kind != CALL:
            if not part:
                continue
            if out and "content" in out[-1]:
                out[-1]["content"] += part
            else:
                out.append({"content": part})
        elif part.id is not None:
            function = {"name": part.name, "arguments": ""}
            out.append({"tool_calls": [{"index": part.index, "id": part.id, "type": "function", "function": function}]})
        else:
            out.append({"tool_calls": [{"index": part.index, "function": {"arguments": part.arguments}}]})
    if reasoning:
        out.insert(0, {"reasoning_content": reasoning})
    return out


async def chat_completions(request: Request) -> Response:
    body = await decode_body(request, ChatCompletionRequest)
    st = await model_state(request, body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    req = chat_request(body)
    prompt = await turn.prompt(st, req)
    gen = await turn.start(st, req, prompt)
    head = response_head(gen, "chatcmpl", "chat.completion.chunk" if body.stream else "chat.completion", st)
    replies = [prompt.reply() for _ in gen.choices]

    def whole(choice: Choice, text: str) -> dict:
        reply = replies[choice.index]
        return {
            "index": choice.index,
            "message": _message(reply, text),
            "logprobs": _chat_logprobs(st, choice, 0, choice.n_tokens) if body.logprobs else None,
            "finish_reason": reply.finish(choice.finish),
        }

    opened = [False] * len(gen.choices)

    def delta(choice: Choice, text: str | None, start: int, end: int) -> list[dict]:
        reply = replies[choice.index]
        deltas = _deltas(reply.feed(text))
        logprobs = _chat_logprobs(st, choice, start, end) if body.logprobs and end > start else None
        if text is None:
            deltas.append({})
        elif logprobs is not None and not deltas:  # the text is held back, its logprobs are not
            deltas.append({"content": ""})
        if deltas and not opened[choice.index]:  # the role rides with the first token, as llama-server sends it
            opened[choice.index] = True
            deltas[0] = {"role": "assistant", **deltas[0]}
        chunks: list[dict] = [
            {"index": choice.index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas
        ]
        if chunks:
            chunks[0]["logprobs"] = logprobs
            if text is None:
                chunks[-1]["finish_reason"] = reply.finish(choice.finish)
        return chunks

    return await respond_openai(request, gen, head, body, whole, delta)


# llama-server's /apply-template reads this door's body, so it lives here (its errors keep llama-server's shape:
# they follow the path, frontend_proc.http.errors).


class TemplateResult(msgspec.Struct):
    prompt: str


async def apply_template(request: Request) -> Response:
    """The prompt text /v1/chat/completions would send for this body: the model's chat template over the messages."""
    body = await decode_body(request, ChatCompletionRequest)
    st = state(request)
    req = chat_request(body)
    plan = turn.tool_plan(req, st.chat_template, st.tokenizer.vocab)
    return json_response(TemplateResult(turn.render(st.chat_template, req, plan)))


operations = [
    Operation(
        "POST",
        "/v1/chat/completions",
        chat_completions,
        "OpenAI: chat completions",
        body=ChatCompletionRequest,
        response=dict,
        events=str,
        errors=GENERATE_ERRORS,
    ),
    Operation(
        "POST",
        "/apply-template",
        apply_template,
        "llama-server: a chat body's prompt, with the model's chat template",
        body=ChatCompletionRequest,
        response=TemplateResult,
    ),
]
