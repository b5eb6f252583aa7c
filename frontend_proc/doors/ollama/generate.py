"""Ollama's POST /api/chat and /api/generate (its other routes: embed, loading, models).

Open WebUI's Ollama connection, the `ollama` clients and LangChain's ChatOllama speak it. The body is read into a
ChatRequest for the chat layer (frontend_proc.chat.turn), and the reply's parts (frontend_proc.chat.reply) are
written as Ollama's message (content, thinking, tool_calls with object arguments), whole or as its stream of JSON
lines, the last one done with the timings in nanoseconds. Errors take Ollama's shape, {"error": "..."}.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import llama_cpp as L
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import invalid
from cllm.core.protocol import SamplingParams
from frontend_proc.chat import turn
from frontend_proc.chat.images import from_base64
from frontend_proc.chat.reply import CONTENT, REASONING, join
from frontend_proc.chat.request import ChatRequest, Fields, template_call, tool
from frontend_proc.core import generation
from frontend_proc.core.output import JsonOutput
from frontend_proc.core.pool import Model
from frontend_proc.core.state import ModelState
from frontend_proc.core.tokenizer import fim_tokens
from frontend_proc.doors.ollama.loading import keep_alive, load_only, loaded_state, unloads
from frontend_proc.doors.ollama.models import find
from frontend_proc.doors.ollama.schemas import NO_OPTIONS, ChatBody, GenerateBody, Message, Options
from frontend_proc.doors.ollama.writer import NDJSON, Stream, Writer, done, tool_calls
from frontend_proc.http import lifecycle
from frontend_proc.http.app import server
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation

_FIELDS = Fields(output="format", tool_schema="tools[{}].function.parameters", max_tokens="options.num_predict")
_GENERATE_FIELDS = Fields(messages="prompt", output="format", max_tokens="options.num_predict")

log = logging.getLogger("cllm.frontend")


# ---- a request in cllm's terms ------------------------------------------------


def _output(fmt) -> JsonOutput | None:
    if not fmt:
        return None
    return JsonOutput(None if fmt == "json" else fmt)


def _sampling(st: ModelState, options: Options) -> SamplingParams:
    seq_ctx = generation.engine_info(st).seq_ctx
    if options.num_ctx is not None and options.num_ctx > seq_ctx:
        # The slot's size is set at launch; a longer prompt still gets the usual 400, never a silent cut.
        log.info("num_ctx %d is clamped to the %d tokens a sequence of this model holds", options.num_ctx, seq_ctx)
    return options.sampling()


def _messages(messages: list[Message]) -> list[dict]:
    out, calls = [], 0
    names: dict[str, str] = {}  # a tool's name -> the id of its latest call, for the tool message that answers it
    for i, m in enumerate(messages):
        entry: dict = {"role": m.role, "content": _with_images(m.content, m.images, f"messages[{i}].images")}
        if m.tool_calls:
            entry["tool_calls"] = []
            for call in m.tool_calls:
                call_id = call.id or f"call_{calls}"
                calls += 1
                names[call.function.name] = call_id
                entry["tool_calls"].append(template_call(call_id, call.function.name, call.function.arguments))
        if m.role == "tool":
            entry["tool_call_id"] = m.tool_call_id or names.get(m.tool_name or "", "")
            if m.tool_name:
                entry["name"] = m.tool_name
        out.append(entry)
    return out


def _with_images(text: str, images: list[str] | None, param: str) -> str | list:
    """A message's text, its images (base64) before it as Ollama places them."""
    if not images:
        return text
    return [*(from_base64(image, f"{param}[{i}]") for i, image in enumerate(images)), text]


def _thinking(think) -> tuple[bool | None, str | None]:
    """think: true/false turns thinking on or off; a level is a reasoning effort."""
    return (True, think) if isinstance(think, str) else (think, None)


def _request(body: ChatBody | GenerateBody, messages: list[dict], st: ModelState, tools=()) -> ChatRequest:
    options = body.options or NO_OPTIONS
    thinking, effort = _thinking(body.think)
    return ChatRequest(
        messages=messages,
        sampling=_sampling(st, options),
        tools=list(tools),
        output=_output(body.format),
        thinking=thinking,
        effort=effort,
        stops=options.stop or (),
        stream=body.stream,
        fields=_FIELDS if isinstance(body, ChatBody) else _GENERATE_FIELDS,
    )


async def _generate_prompt(body: GenerateBody, st: ModelState, req: ChatRequest) -> turn.ChatPrompt:
    """The prompt of /api/generate: the chat template around it, or (raw, suffix) its text as it is."""
    if body.template:
        raise invalid(
            "cllm renders the model's own chat template and cannot run an Ollama (Go) template;"
            " send raw: true with the prompt already formatted",
            "template",
        )
    if body.suffix is None and not body.raw:
        return await turn.prompt(st, req)
    if body.images:
        raise invalid("images need the chat template: a raw or suffix prompt has no place marked for them", "images")
    if body.system:
        raise invalid("system cannot be combined with raw or suffix: the prompt is sent as it is", "system")
    text = body.prompt
    if body.suffix is not None:
        vocab = st.tokenizer.vocab
        fim = fim_tokens(vocab)[:3]
        if min(fim) < 0:
            raise invalid(
                "this model has no fill-in-the-middle tokens, so it cannot complete between prompt and suffix", "suffix"
            )
        pre, suf, mid = (L.llama_vocab_get_text(vocab, t).decode() for t in fim)  # encoded back as the control tokens
        text = f"{pre}{body.prompt}{suf}{body.suffix}{mid}"
    return turn.ChatPrompt(st, text, turn.tool_plan(req, st.chat_template, st.tokenizer.vocab))


async def _respond(
    request: Request,
    body,
    st: ModelState,
    req: ChatRequest,
    prompt: turn.ChatPrompt,
    model: Model,
    keep,
    t0: int,
    load_ns: int,
):
    gen = await turn.start(st, req, prompt)
    writer, reply = Writer(body.model, isinstance(body, ChatBody)), prompt.reply()
    after = BackgroundTask(server(request).pool.unload, model, "keep-alive") if unloads(request, model, keep) else None
    response: Response
    if body.stream:
        response = lifecycle.stream(gen, Stream(gen, reply, writer, t0, load_ns))
    else:
        (text,) = await lifecycle.whole(request, gen)
        parts = reply.whole(text)
        content = join(parts, CONTENT)
        calls = tool_calls(reply)
        response = json_response(
            {
                **writer.obj(content if not calls or content.strip() else "", join(parts, REASONING), calls),
                **done(gen, reply, t0, load_ns),
            }
        )
    response.background = after
    return response


async def chat_route(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    body = await decode_body(request, ChatBody)
    model, keep = find(request, body.model), keep_alive(body.keep_alive)
    if not body.messages:
        return await load_only(request, model, keep, body.model, True)
    st, load_ns = await loaded_state(request, model, keep)
    tools = [tool(t.function.name, t.function.description, t.function.parameters) for t in body.tools or ()]
    req = _request(body, _messages(body.messages), st, tools)
    return await _respond(request, body, st, req, await turn.prompt(st, req), model, keep, t0, load_ns)


async def generate(request: Request) -> Response:
    t0 = time.perf_counter_ns()
    body = await decode_body(request, GenerateBody)
    model, keep = find(request, body.model), keep_alive(body.keep_alive)
    if not body.prompt and body.suffix is None:
        return await load_only(request, model, keep, body.model, False)
    st, load_ns = await loaded_state(request, model, keep)
    messages = ([{"role": "system", "content": body.system}] if body.system else []) + [
        {"role": "user", "content": _with_images(body.prompt, body.images, "images")}
    ]
    req = _request(body, messages, st)
    return await _respond(request, body, st, req, await _generate_prompt(body, st, req), model, keep, t0, load_ns)


_CHAT = Operation(
    "POST",
    "/api/chat",
    chat_route,
    "Ollama: chat",
    body=ChatBody,
    response=dict,
    text=NDJSON,
    errors=(404, *GENERATE_ERRORS),
)
operations = [
    _CHAT,
    replace(_CHAT, path="/api/generate", endpoint=generate, summary="Ollama: generate", body=GenerateBody),
]
