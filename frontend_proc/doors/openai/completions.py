"""The OpenAI-compatible API: /v1/models, /v1/completions, and what its chat completions share with them.

Completions go straight down frontend_proc.core.generation, as /generate does
(chat completions are frontend_proc.doors.openai.chat). Both answer whole or as
SSE chunks ending with `data: [DONE]` (respond_openai, on
frontend_proc.http.lifecycle). Errors take OpenAI's shape (see app.error_body).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError, error_body, json_response
from cllm.core.protocol import TokenLogprobs
from frontend_proc.chat import chat
from frontend_proc.chat.request import Fields, GrammarOutput, JsonOutput, invalid
from frontend_proc.core import generation
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.core.state import AppState
from frontend_proc.doors.llama_server.models import card
from frontend_proc.doors.openai.schemas import CompletionRequest, JsonObjectFormat, JsonSchemaFormat, OpenAIRequest, TextFormat
from frontend_proc.http import lifecycle
from frontend_proc.http.app import decode_body, model_state, sse, state
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation

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


def output(body: OpenAIRequest) -> JsonOutput | GrammarOutput | None:
    fmt = body.response_format
    if body.grammar:  # an empty one is none, as llama-server reads it
        if fmt is not None and type(fmt) is not TextFormat:
            raise invalid("grammar cannot be combined with a JSON response_format", "grammar")
        return GrammarOutput(body.grammar)
    if type(fmt) is JsonSchemaFormat:
        return JsonOutput(fmt.json_schema.schema)
    return JsonOutput() if type(fmt) is JsonObjectFormat else None


def usage(gen: Generation) -> dict:
    return {
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": gen.cached_tokens},
    }


class _Stream(lifecycle.Stream):
    """OpenAI's chunks: delta(choice, text, start, end) makes those of a piece, from the tokens [start, end)
    consumed since the last (text None: the end of the choice); opening(choice), the first of each choice."""

    def __init__(self, gen: Generation, head: dict, body: OpenAIRequest, delta: Callable, opening: Callable | None):
        self.gen, self.head, self.body, self.delta, self.opening = gen, head, body, delta, opening
        self.usage_field = {"usage": None} if body.include_usage else {}
        self.sent = [0] * len(gen.choices)

    def start(self) -> bytes:
        if self.opening is None:
            return b""
        return sse({**self.head, "choices": [self.opening(c) for c in self.gen.choices], **self.usage_field})

    def piece(self, choice: Choice, text: str | None) -> bytes:
        start, self.sent[choice.index] = self.sent[choice.index], choice.n_tokens
        head, usage_field = self.head, self.usage_field
        return b"".join([sse({**head, "choices": [c], **usage_field}) for c in self.delta(choice, text, start, choice.n_tokens)])

    def end(self) -> bytes:
        last = sse({**self.head, "choices": [], "usage": usage(self.gen)}) if self.body.include_usage else b""
        return last + DONE

    def error(self, e: ApiError) -> bytes:
        return sse(error_body("/v1/", e))


async def respond_openai(request: Request, gen: Generation, head: dict, body: OpenAIRequest, whole: Callable, delta: Callable, opening=None) -> Response:
    """The whole response (whole(choice, text): one of its choices), or the stream of chunks."""
    if body.stream:
        return lifecycle.stream(gen, _Stream(gen, head, body, delta, opening))
    texts = await lifecycle.whole(request, gen)
    choices = [whole(c, text) for c, text in zip(gen.choices, texts)]
    return json_response({**head, "choices": choices, "usage": usage(gen)})


def response_head(gen: Generation, prefix: str, obj: str, st: AppState) -> dict:
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
                raise invalid(f"prompt {i} has a token id outside the vocabulary (0..{st.tokenizer.n_vocab - 1})", "prompt")
            prompts.append(p)
        else:
            raise invalid("prompt must be a string, a list of token ids, or a list of strings or token-id lists", "prompt")
    if not prompts:
        raise invalid("prompt is empty", "prompt")
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
        raise invalid("suffix is not supported", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise invalid("best_of must equal n (every choice generated is returned)", "best_of")
    max_tokens = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
    if max_tokens == 0 and not body.echo:
        raise invalid("max_tokens 0 needs echo: true (then the prompt is scored, nothing generated)", "max_tokens")
    want_logprobs = body.logprobs is not None
    if body.echo and want_logprobs and body.stream:
        raise invalid("echo with logprobs is answered whole: send stream false", "stream")
    prompts = _completion_prompts(st, body.prompt)
    scored = body.logprobs if body.echo else None  # prompt logprobs come from the prefill, not the prefix cache
    sampling = body.sampling(max_tokens, body.logprobs, scored)
    chat.check_sampling(st, sampling)
    grammar, _ = chat.constraint(st, output(body), None, body.ignore_eos, Fields())
    sampling.grammar = grammar
    gen = await generation.start(st, prompts, sampling, n=body.n, stops=body.stops, stream=body.stream, prompt_param="prompt")
    head = response_head(gen, "cmpl", "text_completion", st)
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

    return await respond_openai(request, gen, head, body, whole, delta, opening if body.echo else None)


# The response bodies are OpenAI's objects, built in place: the document calls them objects.
operations = [
    Operation("GET", "/v1/models", list_models, "OpenAI: the models, with their status when there are several", response=dict, errors=(503,)),
    Operation("GET", "/v1/models/{model:path}", retrieve_model, "OpenAI: one model", response=dict, errors=(404, 503)),
    Operation(
        "POST", "/v1/completions", completions, "OpenAI: text completions",
        body=CompletionRequest, response=dict, events=str, errors=GENERATE_ERRORS,
    ),
]
