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

import llama_cpp as L
from starlette.requests import Request
from starlette.responses import Response

from cllm.core.errors import ApiError, error_body, json_response
from cllm.core.protocol import SamplingParams
from frontend_proc.chat import chat
from frontend_proc.chat.request import Fields, GrammarOutput, JsonOutput, invalid
from frontend_proc.core import generation
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.core.state import AppState
from frontend_proc.doors.llama_server.infill import FimTokens, infill_prompt, missing_fim
from frontend_proc.doors.llama_server.schemas import CompletionBody, CompletionFields, InfillBody
from frontend_proc.http import lifecycle
from frontend_proc.http.app import decode_body, sse, sse_response, state
from frontend_proc.http.openapi import GENERATE_ERRORS, Operation

RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED, what llama-server reports for seed -1
SAMPLERS = ["top_k", "penalties", "top_p", "min_p", "temperature"]  # cLLM's chain, in llama-server's names
PENALTY_LAST_N = 64  # the engine's (engine_proc.sampler): tokens the penalties look back over
_ID = re.compile(r"-?[0-9]+")  # a token id written as an object key
_FIELDS = Fields(messages="prompt", output="json_schema")


# ---- the request in cLLM's terms ---------------------------------------------


def prompts_of(st: AppState, prompt) -> list[list[int]]:
    """Token lists as llama-server reads `prompt`: an array holding a number is one prompt (ids and text mixed),
    any other array is a list of prompts."""
    if isinstance(prompt, list) and not any(type(p) is int for p in prompt):
        if not prompt:
            raise invalid("prompt must not be empty", "prompt")
        return [mixed(st, p, "prompt") for p in prompt]
    return [mixed(st, prompt, "prompt")]


def mixed(st: AppState, prompt, param: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
    """One prompt: text, token ids, or both in a list (special tokens only before text that comes first)."""
    tokenizer = st.tokenizer
    if isinstance(prompt, str):
        return tokenizer.encode(prompt, add_special, parse_special)
    tokens: list[int] = []
    for i, part in enumerate(prompt):
        if isinstance(part, str):
            tokens += tokenizer.encode(part, add_special and i == 0, parse_special)
        elif type(part) is int:
            if not 0 <= part < tokenizer.n_vocab:
                raise invalid(f"token {part} is outside the vocabulary (0..{tokenizer.n_vocab - 1})", param)
            tokens.append(part)
        else:
            raise invalid("a prompt is a string, token ids, or a list mixing both", param)
    return tokens


def logit_bias(st: AppState, bias) -> dict[int, float] | None:
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
        ids = [key] if type(key) is int else st.tokenizer.encode(key, add_special=False) if isinstance(key, str) else None
        if ids is None:
            raise invalid("a logit_bias token is an id or a text", "logit_bias")
        for t in ids:
            if not 0 <= t < st.tokenizer.n_vocab:
                raise invalid(f"logit_bias names token {t}, outside the vocabulary (0..{st.tokenizer.n_vocab - 1})", "logit_bias")
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


def sampling(st: AppState, body: CompletionFields) -> SamplingParams:
    if body.post_sampling_probs:
        raise invalid(
            "post_sampling_probs is not supported: cLLM reports the model's probabilities, before sampling", "post_sampling_probs"
        )
    predict = body.predict
    params = plain_sampling(body, generation.engine_info(st).seq_ctx if predict < 0 else predict)
    params.logit_bias = logit_bias(st, body.logit_bias)
    params.grammar, _ = chat.constraint(st, output(body), None, body.ignore_eos, _FIELDS)
    return params


def plain_sampling(body: CompletionFields, max_tokens: int) -> SamplingParams:
    """The body's sampling fields, without logit bias or grammar."""
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(body.top_k, 0),
        min_p=body.min_p,
        repetition_penalty=body.repeat_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        seed=None if body.seed == -1 else body.seed,
        ignore_eos=body.ignore_eos,
        logprobs=body.probs or None,
    )


def default_settings() -> dict:
    """The settings of a request that sets nothing, as GET /props shows them."""
    body = CompletionBody()
    return summary(settings(plain_sampling(body, -1), body))


def summary(settings: dict) -> dict:
    """Settings as llama-server's /props and /slots show them: without stop strings, logit bias or grammar."""
    return {k: v for k, v in settings.items() if k not in ("stop", "logit_bias", "grammar")}


# ---- the answer -----------------------------------------------------------------


def settings(params: SamplingParams, body: CompletionFields | None = None, capped: bool = False) -> dict:
    """llama-server's generation_settings: the fields cLLM applies, as applied (with the body: as asked, too;
    n_predict as --max-tokens capped it, as llama-server shows --n-predict's clamp)."""
    predict = params.max_tokens if body is None or capped else body.predict
    out = {
        "seed": RANDOM_SEED if params.seed is None else params.seed,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "repeat_last_n": PENALTY_LAST_N,
        "repeat_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "max_tokens": predict,
        "n_predict": predict,
        "ignore_eos": params.ignore_eos,
        "logit_bias": [{"bias": b, "token": t} for t, b in (params.logit_bias or {}).items()],
        "n_probs": params.logprobs or 0,
        "grammar": params.grammar or "",
        "samplers": SAMPLERS,
    }
    if body is not None:
        out["stop"], out["stream"] = body.stops, body.stream
    return out


def timings(choice: Choice) -> dict:
    rs = choice.stream
    first = rs.t_first or rs.t_done or rs.t_submit
    last = rs.t_done or first
    prompt_n, prompt_ms = rs.prompt_tokens - rs.cached_tokens, (first - rs.t_submit) * 1e3
    predicted_n, predicted_ms = choice.n_tokens, (last - first) * 1e3
    return {
        "cache_n": rs.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
        "predicted_per_second": 1e3 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0,
    }


def stop_type(choice: Choice) -> str:
    if choice.finish == "length":
        return "limit"
    return "word" if choice.stop_string is not None else "eos"


def probabilities(st: AppState, choice: Choice, start: int, end: int) -> list[dict]:
    """completion_probabilities of the tokens [start, end): each token's logprob and its likeliest rivals'."""
    piece = st.tokenizer.piece

    def entry(token: int, logprob: float) -> dict:
        b = piece(token)
        return {"id": token, "token": b.decode(errors="ignore"), "bytes": list(b), "logprob": logprob}

    rs = choice.stream
    return [
        {**entry(t, e.logprob), "top_logprobs": [entry(i, lp) for i, lp in zip(e.top_ids, e.top_logprobs)]}
        for t, e in zip(rs.tokens[start:end], rs.logprobs[start:end])
    ]


def pick(fields: list[str] | None, result: dict) -> dict:
    """response_fields: only the paths asked for ("a/b": b of a), under their paths; missing ones left out."""
    if fields is None:
        return result
    out = {}
    for path in fields:
        value, found = result, True
        for key in path.split("/"):
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                found = False
                break
        if found:
            out[path] = value
    return out


class Answer:
    """Builds llama-server's objects for the choices of one request."""

    def __init__(self, st: AppState, body: CompletionFields, params: SamplingParams, prompts: list[list[int]], gen: Generation):
        self.st, self.body, self.gen, self.prompts = st, body, gen, prompts
        applied = gen.choices[0].stream.sampling  # as the generation core submitted it, --max-tokens applied
        self.settings = settings(applied, body, capped=applied.max_tokens != params.max_tokens)
        self.n = body.count

    def final(self, choice: Choice, text: str, new_line: bool | None = None) -> dict:
        """The whole result (in a stream, the last chunk: text and tokens were sent before, ``new_line`` says
        whether that text had a line break)."""
        rs, body = choice.stream, self.body
        prompt = self.prompts[choice.index // self.n]
        streamed = body.stream
        result = {
            "index": choice.index,
            "content": "" if streamed else text,
            "tokens": rs.tokens[: choice.n_tokens] if body.return_tokens and not streamed else [],
            "id_slot": -1,  # cLLM does not pin requests to slots
            "stop": True,
            "model": self.st.model_id,
            "tokens_predicted": choice.n_tokens,
            "tokens_evaluated": len(prompt),
            "generation_settings": self.settings,
            "prompt": self.st.tokenizer.decode(prompt).decode(errors="replace"),
            "has_new_line": "\n" in text if new_line is None else new_line,
            "truncated": False,
            "stop_type": stop_type(choice),
            "stopping_word": choice.stop_string or "",
            "tokens_cached": len(prompt) + choice.n_tokens,
            "timings": timings(choice),
        }
        if body.probs and not streamed:
            result["completion_probabilities"] = probabilities(self.st, choice, 0, choice.n_tokens)
        return pick(body.response_fields, result)

    def partial(self, choice: Choice, text: str, start: int, end: int) -> dict:
        chunk = {
            "index": choice.index,
            "content": text,
            "tokens": choice.stream.tokens[start:end],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": end,
            "tokens_evaluated": len(self.prompts[choice.index // self.n]),
        }
        if self.body.probs and end > start:
            chunk["completion_probabilities"] = probabilities(self.st, choice, start, end)
        return chunk


class _Stream(lifecycle.Stream):
    def __init__(self, answer: Answer, path: str):
        self.answer, self.path = answer, path
        self.sent = [0] * len(answer.gen.choices)
        self.new_line = [False] * len(answer.gen.choices)  # has_new_line, without keeping the text

    def piece(self, choice: Choice, text: str | None) -> bytes:
        if text is None:
            return sse(self.answer.final(choice, "", self.new_line[choice.index]))
        start, self.sent[choice.index] = self.sent[choice.index], choice.n_tokens
        self.new_line[choice.index] = self.new_line[choice.index] or "\n" in text
        return sse(self.answer.partial(choice, text, start, choice.n_tokens))

    def error(self, e: ApiError) -> bytes:
        return sse(error_body(self.path, e))


async def answer(request: Request, st: AppState, body: CompletionFields, prompts: list[list[int]]) -> Response:
    params = sampling(st, body)
    if params.max_tokens == 0:  # llama-server evaluates the prompt into its cache; cLLM has nothing to give back
        results = nothing(st, body, params, prompts)
        if body.stream:
            return sse_response(iter([b"".join(map(sse, results))]))
        return json_response(results[0] if len(results) == 1 else results)
    gen = await generation.start(st, prompts, params, n=body.count, stops=body.stops, stream=body.stream)
    out = Answer(st, body, params, prompts, gen)
    if body.stream:
        return lifecycle.stream(gen, _Stream(out, request.url.path))
    texts = await lifecycle.whole(request, gen)
    results = [out.final(c, text) for c, text in zip(gen.choices, texts)]
    return json_response(results[0] if len(results) == 1 else results)


def nothing(st: AppState, body: CompletionFields, params: SamplingParams, prompts: list[list[int]]) -> list[dict]:
    """n_predict 0: every result empty, at once (the prompts are checked as any other)."""
    st.client.limits.check(prompts, 0, body.count, "prompt")
    keys = ("cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
            "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second")
    zero = {k: 0 if k.endswith("_n") else 0.0 for k in keys}
    return [
        pick(body.response_fields, {
            "index": i * body.count + j, "content": "", "tokens": [], "id_slot": -1, "stop": True, "model": st.model_id,
            "tokens_predicted": 0, "tokens_evaluated": len(prompt), "generation_settings": settings(params, body),
            "prompt": st.tokenizer.decode(prompt).decode(errors="replace"), "has_new_line": False, "truncated": False,
            "stop_type": "limit", "stopping_word": "", "tokens_cached": len(prompt), "timings": zero,
        })
        for i, prompt in enumerate(prompts) for j in range(body.count)
    ]


# ---- the routes -------------------------------------------------------------------


async def completion(request: Request) -> Response:
    body = await decode_body(request, CompletionBody)
    st = state(request)
    generation.engine_info(st)
    return await answer(request, st, body, prompts_of(st, body.prompt))


def fim_tokens(vocab) -> FimTokens:
    kinds = (L.llama_vocab_fim_pre, L.llama_vocab_fim_suf, L.llama_vocab_fim_mid, L.llama_vocab_fim_rep, L.llama_vocab_fim_sep)
    return FimTokens(*(kind(vocab) for kind in kinds))


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
    body = await decode_body(request, InfillBody)
    prefix = mixed(st, body.input_prefix, "input_prefix", add_special=False, parse_special=False)
    suffix = mixed(st, body.input_suffix, "input_suffix", add_special=False, parse_special=False)
    extra = [(c.filename, c.text) for c in body.input_extra]
    typed = st.tokenizer.encode(body.prompt, add_special=False, parse_special=True)
    prompt = infill_prompt(
        lambda text: st.tokenizer.encode(text, add_special=False, parse_special=False),
        fim, added_bos(vocab), prefix, suffix, extra, typed, info.batch_size, info.seq_ctx,
    )
    return await answer(request, st, body, [prompt])


ANSWER = dict | list[dict]  # an array for several prompts or n_cmpl > 1

operations = [
    Operation(
        "POST", "/completion", completion, "llama-server: text completion in its own shape",
        body=CompletionBody, response=ANSWER, events=dict, errors=GENERATE_ERRORS,
    ),
    Operation(
        "POST", "/completions", completion, "llama-server: /completion under its other name",
        body=CompletionBody, response=ANSWER, events=dict, errors=GENERATE_ERRORS,
    ),
    Operation(
        "POST", "/infill", infill, "llama-server: fill in the middle (501 for a model without FIM tokens)",
        body=InfillBody, response=ANSWER, events=dict, errors=(*GENERATE_ERRORS, 501),
    ),
]
