"""llama-server's result objects for /completion and /infill: its generation_settings, timings, probabilities,
whole or as a stream of chunks."""

from __future__ import annotations

from cllm.core.errors import ApiError
from cllm.core.protocol import SamplingParams
from frontend_proc.core.generation import Choice, Generation, engine_limits
from frontend_proc.core.state import ModelState
from frontend_proc.doors.llama_server.schemas import CompletionFields
from frontend_proc.http import lifecycle
from frontend_proc.http.errors import error_body
from frontend_proc.http.sse import sse

RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED, what llama-server reports for seed -1
SAMPLERS = ["top_k", "penalties", "top_p", "min_p", "temperature"]  # cLLM's chain, in llama-server's names
PENALTY_LAST_N = 64  # the engine's (engine_proc.sampling.sampler): tokens the penalties look back over
# llama-server's samplers and options that cLLM does not run (a request's fields for them are accepted and ignored:
# schemas.IGNORED), at the values that mean "off" there: what every request gets here. /completion's raw prompt
# comes back as content alone, reasoning unparsed; no LoRA, no context shift.
NOT_RUN = {
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "typical_p": 1.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 64,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
    "n_keep": 0,
    "n_discard": 0,
    "min_keep": 0,
    "chat_format": "Content-only",
    "reasoning_format": "none",
    "reasoning_in_content": False,
    "generation_prompt": "",
    "timings_per_token": False,
    "post_sampling_probs": False,
    "backend_sampling": False,
}
DRY_BREAKERS = ["\n", ":", '"', "*"]  # llama.cpp's default, shown though DRY is off
PATTERN = 2  # llama.cpp's COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: a regex over the text so far, as cLLM's triggers are


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
        **NOT_RUN,
        "lora": [{"id": i, "scale": s} for i, s in params.lora or ()],
        "dry_sequence_breakers": DRY_BREAKERS,
        "grammar_lazy": params.grammar_triggers is not None,
        "grammar_triggers": [{"type": PATTERN, "value": t} for t in params.grammar_triggers or []],
        "preserved_tokens": [],
    }
    if body is not None:
        out["stop"], out["stream"] = body.stops, body.stream
    return out


def timings(choice: Choice) -> dict:
    rs = choice.stream
    first = rs.t_first or rs.t_done or rs.t_submit
    last = rs.t_done or first
    drafts = {"draft_n": rs.drafted, "draft_n_accepted": rs.accepted} if rs.drafted else {}  # as llama-server: if any
    prompt_ms, predicted_ms = (first - rs.t_submit) * 1e3, (last - first) * 1e3
    times = _timings(rs.cached_tokens, rs.prompt_tokens - rs.cached_tokens, prompt_ms, choice.n_tokens, predicted_ms)
    return {**times, **drafts}


def _timings(cache_n: int, prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float) -> dict:
    return {
        "cache_n": cache_n,
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


def probabilities(st: ModelState, choice: Choice, start: int, end: int) -> list[dict]:
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

    def __init__(
        self, st: ModelState, body: CompletionFields, params: SamplingParams, prompts: list[list[int]], gen: Generation
    ):
        self.st, self.body, self.gen, self.prompts = st, body, gen, prompts
        applied = gen.choices[0].stream.sampling  # as the generation core submitted it, --max-tokens applied
        assert applied is not None  # a generation's stream has its sampling
        self.settings = settings(applied, body, capped=applied.max_tokens != engine_limits(st).asked(params.max_tokens))
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
            "tokens_evaluated": rs.prompt_tokens,  # an image's positions counted
            "generation_settings": self.settings,
            "prompt": self.st.tokenizer.decode(prompt).decode(errors="replace"),
            "has_new_line": "\n" in text if new_line is None else new_line,
            "truncated": False,
            "stop_type": stop_type(choice),
            "stopping_word": choice.stop_string or "",
            "tokens_cached": rs.prompt_tokens + choice.n_tokens,
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
            "tokens_evaluated": choice.stream.prompt_tokens,
        }
        if self.body.probs and end > start:
            chunk["completion_probabilities"] = probabilities(self.st, choice, start, end)
        return chunk


class Stream(lifecycle.Stream):
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


def nothing(st: ModelState, body: CompletionFields, params: SamplingParams, prompts: list[list[int]]) -> list[dict]:
    """n_predict 0: every result empty, at once (the prompts are checked as any other)."""
    engine_limits(st).check(prompts, 0, body.count, "prompt")
    zero = _timings(0, 0, 0.0, 0, 0.0)
    return [
        pick(
            body.response_fields,
            {
                "index": i * body.count + j,
                "content": "",
                "tokens": [],
                "id_slot": -1,
                "stop": True,
                "model": st.model_id,
                "tokens_predicted": 0,
                "tokens_evaluated": len(prompt),
                "generation_settings": settings(params, body),
                "prompt": st.tokenizer.decode(prompt).decode(errors="replace"),
                "has_new_line": False,
                "truncated": False,
                "stop_type": "limit",
                "stopping_word": "",
                "tokens_cached": len(prompt),
                "timings": zero,
            },
        )
        for i, prompt in enumerate(prompts)
        for j in range(body.count)
    ]
