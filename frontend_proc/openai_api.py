"""The OpenAI-compatible API: /v1/models, /v1/completions, /v1/chat/completions.

Both generation routes go through frontend_proc.generation, as /generate
does; this module turns a request into prompts and SamplingParams and a
Generation into OpenAI's response shapes (whole, or as SSE chunks ending
with `data: [DONE]`). Errors take OpenAI's shape (see app.error_body).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.protocol import TokenLogprobs
from frontend_proc import generation
from frontend_proc.app import AppState, decode_body, model_state, sse, sse_response, state
from frontend_proc.chat import ChatPrompt, join, template_context
from frontend_proc.cllm_api import GENERATE_ERRORS
from cllm.core.errors import ApiError, error_body, json_response
from frontend_proc.generation import Choice, Generation
from frontend_proc.grammar import GrammarError, response_format_grammar
from frontend_proc.models_api import card
from frontend_proc.openai_schemas import ChatCompletionRequest, CompletionRequest, OpenAIRequest
from frontend_proc.openai_tools import ChatOutput, chat_plan, chat_prompt
from frontend_proc.openapi import Operation
from frontend_proc.reasoning import CONTENT, REASONING
from frontend_proc.tools import ToolPlan

DONE = b"data: [DONE]\n\n"
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


async def list_models(request: Request) -> Response:
    st = state(request)
    if not st.pool.multi:
        generation.engine_info(st)
    return json_response({"object": "list", "data": [card(m, st.pool.multi) for m in st.pool.models]})


async def retrieve_model(request: Request) -> Response:
    st = state(request)
    name = request.path_params["model"]
    model = st.pool.by_name.get(name)
    if model is None:
        raise ApiError(404, "model not found", f"the model `{name}` does not exist", param="model", code="model_not_found")
    if not st.pool.multi:
        generation.engine_info(st)
    return json_response(card(model, st.pool.multi))


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, "invalid request", message, param=param)


async def _start(
    st: AppState,
    body: OpenAIRequest,
    prompts: list[list[int]],
    max_tokens: int,
    logprobs: int | None,
    prompt_param: str,
    tool_plan: ToolPlan | None = None,
    prompt_logprobs: int | None = None,
    shown: frozenset[int] = frozenset(),
) -> Generation:
    """shown: control tokens the text must show (see ChatPrompt)."""
    n_vocab = st.tokenizer.n_vocab
    for token in body.logit_bias or ():
        if not 0 <= token < n_vocab:
            raise _invalid(f"logit_bias names token {token}, outside the vocabulary (0..{n_vocab - 1})", "logit_bias")
    try:
        grammar = response_format_grammar(body.response_format, st.tokenizer.vocab)
    except GrammarError as e:
        raise _invalid(str(e), "response_format") from None
    triggers = None
    if tool_plan is not None and tool_plan.grammar is not None:
        if grammar is not None:  # one grammar per sequence
            raise _invalid("response_format cannot be combined with tools unless tool_choice is none", "response_format")
        grammar, triggers = tool_plan.grammar, tool_plan.triggers
    if grammar is not None and body.ignore_eos:
        # The grammar's last rule can only be followed by an end-of-generation token.
        raise _invalid("ignore_eos cannot be combined with a JSON response_format", "ignore_eos")
    return await generation.start(
        st,
        prompts,
        body.sampling(max_tokens, grammar, logprobs, triggers, prompt_logprobs),
        n=body.n,
        stops=body.stops,
        stream=body.stream,
        prompt_param=prompt_param,
        shown=shown,
    )


def _usage(gen: Generation) -> dict:
    return {
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": gen.cached_tokens},
    }


async def _respond(
    request: Request,
    gen: Generation,
    head: dict,
    body: OpenAIRequest,
    whole: Callable[[Choice, str], dict],
    delta: Callable[[Choice, str | None, int, int], list[dict]],
    opening: Callable[[Choice], dict] | None = None,
) -> Response:
    """A non-streaming response, or an SSE stream of chunks, from the generation's choices.

    whole(choice, text) is one choice of the complete response; delta(choice,
    text, start, end) the choices of the chunks a piece makes (none, one, or
    several), with text None for the end of the choice and tokens [start, end)
    the ones consumed since the last.
    """
    if not body.stream:
        return await _respond_whole(request, gen, head, whole)
    usage_field = {"usage": None} if body.include_usage else {}

    async def events():
        try:
            if opening is not None:
                yield sse({**head, "choices": [opening(c) for c in gen.choices], **usage_field})
            sent = [0] * len(gen.choices)
            async for choice, text in gen.pieces():
                if text is None and choice.finish == "error":
                    yield sse(error_body("/v1/", generation.engine_refused()))
                    return
                start, sent[choice.index] = sent[choice.index], choice.n_tokens
                for c in delta(choice, text, start, choice.n_tokens):
                    yield sse({**head, "choices": [c], **usage_field})
            if body.include_usage:
                yield sse({**head, "choices": [], "usage": _usage(gen)})
            yield DONE
        except ApiError as e:  # the status line is sent: say what went wrong in the stream
            yield sse(error_body("/v1/", e))
        finally:
            gen.close()

    return sse_response(events())


async def _respond_whole(request: Request, gen: Generation, head: dict, whole: Callable[[Choice, str], dict]) -> Response:
    try:
        texts = await gen.texts(request)
    finally:
        gen.close()
    choices = [whole(c, text) for c, text in zip(gen.choices, texts)]
    return json_response({**head, "choices": choices, "usage": _usage(gen)})


def _head(gen: Generation, prefix: str, obj: str, st: AppState) -> dict:
    return {"id": f"{prefix}-{gen.choices[0].stream.id}", "object": obj, "created": int(time.time()), "model": st.model_id}


# ---- /v1/completions ---------------------------------------------------------


def _completion_prompts(st: AppState, prompt: str | list) -> list[list[int]]:
    """A string, token ids, or a list of strings and token-id lists: one token list per prompt."""
    if isinstance(prompt, str):
        return [st.tokenizer.encode(prompt)]
    if prompt and all(type(p) is int for p in prompt):
        prompt = [prompt]
    prompts = []
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            prompts.append(st.tokenizer.encode(p))
        elif isinstance(p, list):
            if not all(0 <= t < st.tokenizer.n_vocab for t in p):
                raise _invalid(f"prompt {i} has a token id outside the vocabulary (0..{st.tokenizer.n_vocab - 1})", "prompt")
            prompts.append(p)
        else:
            raise _invalid("prompt must be a string, a list of token ids, or a list of strings or token-id lists", "prompt")
    if not prompts:
        raise _invalid("prompt is empty", "prompt")
    return prompts


def _legacy_logprobs(st: AppState, token_ids: list[int], entries: list[TokenLogprobs | None], offset: int) -> dict:
    """Legacy completions logprobs of the tokens (None: a token without, the prompt's first); text_offset counts from offset."""
    token_str = st.tokenizer.token_str
    tokens = [token_str(t) for t in token_ids]
    return {
        "tokens": tokens,
        "token_logprobs": [e and e.logprob for e in entries],
        "top_logprobs": [e and {token_str(i): lp for i, lp in zip(e.top_ids, e.top_logprobs)} for e in entries],
        "text_offset": list(itertools.accumulate(map(len, tokens), initial=offset))[:-1],
    }


def _completion_logprobs(st: AppState, choice: Choice, start: int, end: int, offset: int) -> dict:
    """Logprobs of the choice's tokens [start, end)."""
    return _legacy_logprobs(st, choice.stream.tokens[start:end], choice.stream.logprobs[start:end], offset)


def _echo_logprobs(st: AppState, prompt: list[int], choice: Choice) -> dict:
    """The prompt's logprobs, then the completion's."""
    lp = _legacy_logprobs(st, prompt, [None, *choice.stream.prompt_logprobs], 0)
    rest = _completion_logprobs(st, choice, 0, choice.n_tokens, sum(map(len, lp["tokens"])))
    return {key: lp[key] + rest[key] for key in lp}


async def completions(request: Request) -> Response:
    body = await decode_body(request, CompletionRequest)
    st = await model_state(request, body.model)
    if body.suffix:
        raise _invalid("suffix is not supported", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise _invalid("best_of must equal n (every choice generated is returned)", "best_of")
    max_tokens = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    if max_tokens == 0 and not body.echo:
        raise _invalid("max_tokens 0 needs echo: true (then the prompt is scored, nothing generated)", "max_tokens")
    want_logprobs = body.logprobs is not None
    if body.echo and want_logprobs and body.stream:
        raise _invalid("echo with logprobs is answered whole: send stream false", "stream")
    prompts = _completion_prompts(st, body.prompt)
    scored = body.logprobs if body.echo else None  # prompt logprobs come from the prefill, not the prefix cache
    gen = await _start(st, body, prompts, max_tokens, body.logprobs, "prompt", prompt_logprobs=scored)
    head = _head(gen, "cmpl", "text_completion", st)
    text_len = [0] * len(gen.choices)

    def prompt_of(choice: Choice) -> list[int]:
        return prompts[choice.index // body.n]  # choices go prompt by prompt, n each

    def echoed(choice: Choice) -> str:
        return st.tokenizer.decode(prompt_of(choice)).decode(errors="replace") if body.echo else ""

    def whole(choice: Choice, text: str) -> dict:
        logprobs = None
        if want_logprobs:
            if body.echo:
                logprobs = _echo_logprobs(st, prompt_of(choice), choice)
            else:
                logprobs = _completion_logprobs(st, choice, 0, choice.n_tokens, 0)
        return {"index": choice.index, "text": echoed(choice) + text, "logprobs": logprobs, "finish_reason": choice.finish}

    def opening(choice: Choice) -> dict:
        return {"index": choice.index, "text": echoed(choice), "logprobs": None, "finish_reason": None}

    def delta(choice: Choice, text: str | None, start: int, end: int) -> list[dict]:
        logprobs = None
        if want_logprobs and end > start:
            logprobs = _completion_logprobs(st, choice, start, end, text_len[choice.index])
            text_len[choice.index] += sum(map(len, logprobs["tokens"]))
        if text is None:
            return [{"index": choice.index, "text": "", "logprobs": logprobs, "finish_reason": choice.finish}]
        return [{"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": None}]

    return await _respond(request, gen, head, body, whole, delta, opening if body.echo else None)


# ---- /v1/chat/completions ----------------------------------------------------


def _chat_logprobs(st: AppState, choice: Choice, start: int, end: int) -> dict:
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


async def chat_completions(request: Request) -> Response:
    body = await decode_body(request, ChatCompletionRequest)
    st = await model_state(request, body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise _invalid("top_logprobs needs logprobs: true", "top_logprobs")
    info = generation.engine_info(st)
    tool_plan = chat_plan(body, st.chat_template, st.tokenizer.vocab)
    context = template_context(effort=body.reasoning_effort, kwargs=body.chat_template_kwargs)
    prompt = ChatPrompt(st, chat_prompt(body, st.chat_template, tool_plan, context), tool_plan)
    max_tokens = body.max_completion_tokens or body.max_tokens or info.seq_ctx  # default: what the sequence holds
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    gen = await _start(st, body, [prompt.tokens], max_tokens, logprobs, "messages", tool_plan, shown=prompt.shown)
    head = _head(gen, "chatcmpl", "chat.completion.chunk" if body.stream else "chat.completion", st)
    outputs = [ChatOutput(tool_plan) for _ in gen.choices]
    splitters = [prompt.splitter() for _ in gen.choices]  # thinking apart from the answer, which is read for calls

    def lp(choice: Choice, start: int, end: int) -> dict | None:
        return _chat_logprobs(st, choice, start, end) if body.logprobs and end > start else None

    def whole(choice: Choice, text: str) -> dict:
        out = outputs[choice.index]
        return {
            "index": choice.index,
            "message": _with_reasoning(out, prompt.split(text)),
            "logprobs": _chat_logprobs(st, choice, 0, choice.n_tokens) if body.logprobs else None,
            "finish_reason": out.finish_reason(choice.finish),
        }

    def opening(choice: Choice) -> dict:
        return {"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def delta(choice: Choice, text: str | None, start: int, end: int) -> list[dict]:
        out, splitter = outputs[choice.index], splitters[choice.index]
        if splitter is None:
            deltas = out.deltas(text)
        else:
            parts = splitter.feed(text) if text is not None else splitter.flush()
            deltas = out.deltas(content) if (content := join(parts, CONTENT)) else []
            if text is None:
                deltas += out.deltas(None)
            if reasoning := join(parts, REASONING):
                deltas.insert(0, {"reasoning_content": reasoning})
        logprobs = lp(choice, start, end)
        if text is None:
            deltas.append({})
        elif logprobs is not None and not deltas:  # the text is held back, its logprobs are not
            deltas.append({"content": ""})
        chunks = [{"index": choice.index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas]
        if chunks:
            chunks[0]["logprobs"] = logprobs
            if text is None:
                chunks[-1]["finish_reason"] = out.finish_reason(choice.finish)
        return chunks

    return await _respond(request, gen, head, body, whole, delta, opening)


def _with_reasoning(out: ChatOutput, parts: list[tuple[str, str]]) -> dict:
    """The message of the answer's parts (tool calls read out of them), with reasoning_content if any."""
    message = out.message(join(parts, CONTENT))
    if reasoning := join(parts, REASONING):
        message["reasoning_content"] = reasoning
    return message


# The response bodies are OpenAI's objects, built in place: the document calls them objects.
operations = [
    Operation("GET", "/v1/models", list_models, "OpenAI: the models, with their status when there are several", response=dict, errors=(503,)),
    Operation("GET", "/v1/models/{model:path}", retrieve_model, "OpenAI: one model", response=dict, errors=(404, 503)),
    Operation(
        "POST", "/v1/completions", completions, "OpenAI: text completions",
        body=CompletionRequest, response=dict, events=str, errors=GENERATE_ERRORS,
    ),
    Operation(
        "POST", "/v1/chat/completions", chat_completions, "OpenAI: chat completions",
        body=ChatCompletionRequest, response=dict, events=str, errors=GENERATE_ERRORS,
    ),
]
