"""OpenAI's completions: POST /v1/completions.

Completions go straight down frontend_proc.core.generation, as /generate does
(chat completions are frontend_proc.doors.openai.chat_completions); both answer through
frontend_proc.doors.openai.writer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import invalid
from cllm.core.protocol import TokenLogprobs
from frontend_proc.core import generation
from frontend_proc.core.generation import Choice
from frontend_proc.core.output import grammar_for
from frontend_proc.core.sampling import check_logit_bias
from frontend_proc.core.state import ModelState
from frontend_proc.doors.openai.schemas import CompletionRequest
from frontend_proc.doors.openai.writer import output, respond_openai, response_head
from frontend_proc.http.app import model_state
from frontend_proc.http.body import decode_body
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _completion_prompts(st: ModelState, prompt: str | list) -> list[list[int]]:
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
                raise invalid(
                    f"prompt {i} has a token id outside the vocabulary (0..{st.tokenizer.n_vocab - 1})", "prompt"
                )
            prompts.append(p)
        else:
            raise invalid(
                "prompt must be a string, a list of token ids, or a list of strings or token-id lists", "prompt"
            )
    if not prompts:
        raise invalid("prompt is empty", "prompt")
    return prompts


def _legacy_logprobs(
    st: ModelState, token_ids: list[int], entries: Sequence[TokenLogprobs | None], offset: int
) -> dict:
    """Legacy completions logprobs of the tokens (None: a token without, the prompt's first); text_offset counts from
    offset."""
    token_str = st.tokenizer.token_str
    tokens = [token_str(t) for t in token_ids]
    return {
        "tokens": tokens,
        "token_logprobs": [e and e.logprob for e in entries],
        "top_logprobs": [e and {token_str(i): lp for i, lp in zip(e.top_ids, e.top_logprobs)} for e in entries],
        "text_offset": list(itertools.accumulate(map(len, tokens), initial=offset))[:-1],
    }


def _completion_logprobs(st: ModelState, choice: Choice, start: int, end: int, offset: int) -> dict:
    """Logprobs of the choice's tokens [start, end)."""
    return _legacy_logprobs(st, choice.stream.tokens[start:end], choice.stream.logprobs[start:end], offset)


def _echo_logprobs(st: ModelState, prompt: list[int], choice: Choice) -> dict:
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
    check_logit_bias(sampling, st.tokenizer.n_vocab)
    sampling.grammar = grammar_for(st.tokenizer.vocab, output(body), "response_format", body.ignore_eos)
    gen = await generation.start(
        st, prompts, sampling, n=body.n, stops=body.stops, stream=body.stream, prompt_param="prompt"
    )
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
        return {
            "index": choice.index,
            "text": echoed(choice) + text,
            "logprobs": logprobs,
            "finish_reason": choice.finish,
        }

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
    Operation(
        "POST",
        "/v1/completions",
        completions,
        "OpenAI: text completions",
        body=CompletionRequest,
        response=dict,
        events=str,
        errors=GENERATE_ERRORS,
    ),
]
