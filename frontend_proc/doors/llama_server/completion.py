"""llama-server's /completion and /infill: a door onto the one generation path, in llama-server's shapes.

The body's prompt (a string, token ids, a mix, or a list of prompts) becomes
token lists as llama-server tokenizes them; /infill builds its
fill-in-the-middle prompt as llama-server does (frontend_proc.doors.llama_server.infill). Both go
down frontend_proc.core.generation like every other door; a grammar or JSON schema
goes through the chat layer's constraint. The answer is llama-server's
object (`content`, `stop_type`, `timings`, `generation_settings`, ...; an
array for several prompts or n_cmpl > 1), or its stream: `data: {...}` per
piece of text, the last with `stop: true` and the whole result's fields.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import llama_cpp as L
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError, invalid
from cllm.core.protocol import ImageInput, SamplingParams
from frontend_proc.chat import turn
from frontend_proc.chat.images import SHOWN_MARKER, from_base64, split
from frontend_proc.core import generation
from frontend_proc.core.output import GrammarOutput, JsonOutput, grammar_for
from frontend_proc.core.sampling import REST
from frontend_proc.core.state import ModelState
from frontend_proc.core.tokenizer import fim_tokens
from frontend_proc.doors.llama_server.infill import infill_prompt, missing_fim
from frontend_proc.doors.llama_server.schemas import CompletionBody, CompletionFields, InfillBody, MultimodalPrompt
from frontend_proc.doors.llama_server.writer import Answer, Stream, nothing, settings
from frontend_proc.http import lifecycle
from frontend_proc.http.app import state
from frontend_proc.http.body import decode_body
from frontend_proc.http.errors import json_response
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation
from frontend_proc.http.sse import sse, sse_response

_ID = re.compile(r"-?[0-9]+")  # a token id written as an object key


# ---- the request in cLLM's terms ---------------------------------------------


async def prompts_of(st: ModelState, prompt) -> tuple[list[list[int]], list[ImageInput]]:
    """Token lists as llama-server reads `prompt`: an array holding a number is one prompt (ids and text mixed),
    any other array is a list of prompts; a multimodal prompt's images, with its tokens (the only prompt)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], MultimodalPrompt):
        prompt = prompt[0]
    if isinstance(prompt, MultimodalPrompt):
        param = "prompt.multimodal_data"
        found = [from_base64(data, f"{param}[{i}]") for i, data in enumerate(prompt.multimodal_data)]
        if not found:
            return [st.tokenizer.encode(prompt.prompt_string)], []
        data = await turn.image_bytes(st, found)
        tokens, inputs = split(st.tokenizer.encode, prompt.prompt_string, SHOWN_MARKER, data, "prompt.prompt_string")
        return [tokens], inputs
    return plain_prompts(st, prompt), []


def plain_prompts(st: ModelState, prompt) -> list[list[int]]:
    if isinstance(prompt, list) and not any(type(p) is int for p in prompt):
        if not prompt:
            raise invalid("prompt must not be empty", "prompt")
        return [mixed(st, p, "prompt") for p in prompt]
    return [mixed(st, prompt, "prompt")]


def mixed(st: ModelState, prompt, param: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
    """One prompt: text, token ids, or both in a list (special tokens only before text that comes first)."""
    tokenizer = st.tokenizer
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special, parse_special)
    if not isinstance(prompt, list):  # a multimodal prompt among others
        raise invalid("a prompt is a string, token ids, a list mixing both, or one multimodal prompt", param)
    tokens: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            tokens += tokenizer.encode(part, add_special and i == 0, parse_special)
        elif type(part) is int:
            if not 0 <= part < tokenizer.n_vocab:
                raise invalid(f"token {part} is outside the vocabulary (0..{tokenizer.n_vocab - 1})", param)
            tokens.append(part)
        else:
            raise invalid("a prompt is a string, token ids, a list mixing both, or one multimodal prompt", param)
    return tokens


def logit_bias(st: ModelState, bias) -> dict[int, float] | None:
    """llama-server's two forms, {"id or text": bias} and [[id or text, bias], ...]; false bans a token."""
    if not bias:
        return None
    pairs = bias.items() if isinstance(bias, dict) else bias
    out: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(bias, dict) and len(pair) != 2:
            raise invalid("logit_bias entries are [token, bias] pairs", "logit_bias")
        key, value = pair
        if value is False:
            value = -math.inf
        elif type(value) not in (int, float) or not math.isfinite(value):
            raise invalid("a logit_bias bias is a number, or false to ban the token", "logit_bias")
        if isinstance(key, str) and _ID.fullmatch(key):
            key = int(key)
        ids = (
            [key] if type(key) is int else st.tokenizer.encode(key, add_special=False) if isinstance(key, str) else None
        )
        if ids is None:
            raise invalid("a logit_bias token is an id or a text", "logit_bias")
        for t in ids:
            if not 0 <= t < st.tokenizer.n_vocab:
                raise invalid(
                    f"logit_bias names token {t}, outside the vocabulary (0..{st.tokenizer.n_vocab - 1})", "logit_bias"
                )
            out[t] = float(value)
    return out


def output(body: CompletionFields) -> JsonOutput | GrammarOutput | None:
    if body.grammar_lazy:
        raise invalid("grammar_lazy is not supported: a grammar applies from the first token", "grammar_lazy")
    if body.grammar and body.json_schema is not None:
        raise invalid("grammar and json_schema cannot be combined", "grammar")
    if body.grammar:
        return GrammarOutput(body.grammar)
    if body.json_schema is not None:
        return JsonOutput(body.json_schema or {"type": "object"})  # {} means any object, as llama-server reads it
    return None


def sampling(st: ModelState, body: CompletionFields) -> SamplingParams:
    if body.post_sampling_probs:
        raise invalid(
            "post_sampling_probs is not supported: cLLM reports the model's probabilities, before sampling",
            "post_sampling_probs",
        )
    predict = body.predict
    params = plain_sampling(body, REST if predict < 0 else predict)
    params.logit_bias = logit_bias(st, body.logit_bias)
    params.grammar = grammar_for(st.tokenizer.vocab, output(body), "json_schema", body.ignore_eos)
    return params


def plain_sampling(body: CompletionFields, max_tokens: int) -> SamplingParams:
    """The body's sampling fields, without logit bias or grammar."""
    return body.params(max_tokens, logprobs=body.probs or None)


def default_settings() -> dict:
    """The settings of a request that sets nothing, as GET /props shows them."""
    body = CompletionBody()
    return summary(settings(plain_sampling(body, REST), body))


_NOT_SUMMED = (
    "stop",
    "logit_bias",
    "grammar",
    "grammar_lazy",
    "grammar_triggers",
    "preserved_tokens",
    "dry_sequence_breakers",
)


def summary(settings: dict) -> dict:
    """Settings as llama-server's /props and /slots show them: without stop strings, logit bias or grammar."""
    return {k: v for k, v in settings.items() if k not in _NOT_SUMMED}


async def answer(
    request: Request,
    st: ModelState,
    body: CompletionFields,
    prompts: list[list[int]],
    images: list[ImageInput] | None = None,
) -> Response:
    params = sampling(st, body)
    if params.max_tokens == 0:  # llama-server evaluates the prompt into its cache; cLLM has nothing to give back
        results = nothing(st, body, params, prompts)
        if body.stream:
            return sse_response(iter([b"".join(map(sse, results))]))
        return json_response(results[0] if len(results) == 1 else results)
    gen = await generation.start(
        st,
        prompts,
        params,
        n=body.count,
        stops=body.stops,
        stream=body.stream,
        limit_param=body.predict_field,
        images=images,
    )
    out = Answer(st, body, params, prompts, gen)
    if body.stream:
        return lifecycle.stream(gen, Stream(out, request.url.path))
    texts = await lifecycle.whole(request, gen)
    results = [out.final(c, text) for c, text in zip(gen.choices, texts)]
    return json_response(results[0] if len(results) == 1 else results)


# ---- the routes -------------------------------------------------------------------


async def completion(request: Request) -> Response:
    body: Any = await decode_body(request, CompletionBody, near_misses=True)  # a Struct made by msgspec.defstruct
    st = state(request)
    generation.engine_info(st)
    return await answer(request, st, body, *await prompts_of(st, body.prompt))


def added_bos(vocab) -> int | None:
    """The BOS token the model's tokenizer adds, if it adds one."""
    return L.llama_vocab_bos(vocab) if L.llama_vocab_get_add_bos(vocab) else None


async def infill(request: Request) -> Response:
    st = state(request)
    info = generation.engine_info(st)
    vocab = st.tokenizer.vocab
    fim = fim_tokens(vocab)
    if missing := missing_fim(fim):  # checked first, as llama-server does
        raise ApiError(501, "not supported", f"Infill is not supported by this model: {missing}")
    body: Any = await decode_body(request, InfillBody, near_misses=True)
    prefix = mixed(st, body.input_prefix, "input_prefix", add_special=False, parse_special=False)
    suffix = mixed(st, body.input_suffix, "input_suffix", add_special=False, parse_special=False)
    extra = [(c.filename, c.text) for c in body.input_extra]
    typed = st.tokenizer.encode(body.prompt, add_special=False, parse_special=True)
    prompt = infill_prompt(
        lambda text: st.tokenizer.encode(text, add_special=False, parse_special=False),
        fim,
        added_bos(vocab),
        prefix,
        suffix,
        extra,
        typed,
        info.batch_size,
        info.seq_ctx,
    )
    return await answer(request, st, body, [prompt])


ANSWER = dict | list[dict]  # an array for several prompts or n_cmpl > 1

_COMPLETION = Operation(
    "POST",
    "/completion",
    completion,
    "llama-server: text completion in its own shape",
    body=CompletionBody,
    response=ANSWER,
    events=dict,
    errors=GENERATE_ERRORS,
)
operations = [
    _COMPLETION,
    replace(_COMPLETION, path="/completions", summary="llama-server: /completion under its other name"),
    replace(
        _COMPLETION,
        path="/infill",
        endpoint=infill,
        summary="llama-server: fill in the middle (501 for a model without FIM tokens)",
        body=InfillBody,
        errors=(*GENERATE_ERRORS, 501),
    ),
]
