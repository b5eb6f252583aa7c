"""Request bodies of llama-server's own API (/completion, /infill, /apply-template, /tokenize, /detokenize,
/slots/{id}).

Defaults are llama-server's (temperature 0.8, top_k 40, top_p 0.95, min_p
0.05, n_predict -1: until the end of generation or of the sequence's
context). A field llama-server knows but cLLM does not apply (DRY, XTC,
mirostat, `samplers`, ...; the list is IGNORED) is declared and ignored, as
llama-server's clients send them routinely; any other unknown field is
dropped with a debug log, as llama-server ignores what it does not read. A value out of range is a 400 too,
where llama-server would clamp it.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from frontend_proc.core.sampling import RepetitionPenalty, Sampling, Seed

# Fields of llama-server's /completion that cLLM accepts and ignores (see docs/llama-server-api.md).
IGNORED = (
    # sampling cLLM's sampler chain does not have
    "dynatemp_range",
    "dynatemp_exponent",
    "typical_p",
    "top_n_sigma",
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "adaptive_target",
    "adaptive_decay",
    "min_keep",
    "samplers",
    "repeat_last_n",
    "tfs_z",
    "penalize_nl",
    "backend_sampling",
    # context and cache management cLLM does on its own
    "n_keep",
    "n_discard",
    "n_cache_reuse",
    "id_slot",
    "slot_id",
    # output and transport details
    "verbose",
    "timings_per_token",
    "return_progress",
    "sse_ping_interval",
    "stream_options",
    "n_indent",
    "t_max_predict_ms",
    # chat parsing and reasoning budgets: /v1/chat/completions' business, or not cLLM's
    "chat_format",
    "reasoning_format",
    "generation_prompt",
    "parse_tool_calls",
    "chat_parser",
    "continue_final_message",
    "echo",
    "preserved_tokens",
    "grammar_triggers",
    "grammar_type",
    "reasoning_control",
    "reasoning_budget_tokens",
    "reasoning_budget_start_tag",
    "reasoning_budget_end_tags",
    "reasoning_budget_end_tag",
    "reasoning_budget_message",
    "message_delimiters",
    "model",
)

NProbs = Annotated[int, Meta(ge=0, le=20)]


class MultimodalPrompt(msgspec.Struct):
    """A prompt with images: each `<__media__>` in the text is where the next image (base64) goes."""

    prompt_string: str
    multimodal_data: list[str] = []


# A string, token ids, a mix, a multimodal prompt; or a list of those (one result each).
Prompt = str | MultimodalPrompt | list[int | str | list[int | str] | MultimodalPrompt]


class CompletionFields(Sampling, kw_only=True):
    """What /completion and /infill honour: the sampling fields with llama-server's defaults and names, and its own."""

    prompt: Prompt = ""
    n_predict: Annotated[int, Meta(ge=-1)] | None = None  # -1: until the end; 0: evaluate nothing, answer at once
    max_tokens: Annotated[int, Meta(ge=-1)] | None = None  # llama-server's other names for n_predict
    max_completion_tokens: Annotated[int, Meta(ge=-1)] | None = None
    temperature: Annotated[float, Meta(ge=0)] = 0.8
    top_p: Annotated[float, Meta(ge=0, le=1)] = 0.95
    min_p: Annotated[float, Meta(ge=0, le=1)] = 0.05
    repetition_penalty: RepetitionPenalty = msgspec.field(default=1.0, name="repeat_penalty")
    seed: Seed = -1  # -1: a random seed
    stop: str | list[str] | None = None
    n_probs: NProbs | None = None
    logprobs: NProbs | None = None  # llama-server's other name for n_probs
    logit_bias: dict[str, float | bool] | list[list[int | str | float | bool]] | None = None
    grammar: str | None = None  # GBNF, start symbol root
    json_schema: dict | None = None
    grammar_lazy: bool = False  # true (a grammar only once triggered) is refused: cLLM applies a grammar from the start
    post_sampling_probs: bool = False  # true is refused: cLLM reports the model's probabilities, before sampling
    n_cmpl: Annotated[int, Meta(ge=1, le=128)] | None = None  # completions per prompt
    n: Annotated[int, Meta(ge=1, le=128)] | None = None  # llama-server's other name for n_cmpl
    stream: bool = False
    cache_prompt: bool = True  # cLLM's prefix cache serves every request (unless --no-prefix-cache)
    return_tokens: bool = False  # the generated token ids in `tokens` (streamed chunks always carry theirs)
    response_fields: list[str] | None = None  # only these fields; "a/b" moves b of a to the top

    @property
    def predict(self) -> int:
        for value in (self.n_predict, self.max_tokens, self.max_completion_tokens):
            if value is not None:
                return value
        return -1

    @property
    def predict_field(self) -> str:
        """The name the client set predict with, for the 400 of a limit too large."""
        for name in ("n_predict", "max_tokens", "max_completion_tokens"):
            if getattr(self, name) is not None:
                return name
        return "n_predict"

    def engine_seed(self) -> int | None:
        return None if self.seed == -1 else self.seed

    @property
    def probs(self) -> int:
        return self.n_probs if self.n_probs is not None else self.logprobs or 0

    @property
    def count(self) -> int:
        return self.n_cmpl or self.n or 1

    @property
    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]  # llama-server skips empty ones


def _with_ignored(name: str, base: type) -> type:
    return msgspec.defstruct(
        name,
        [(field, Any, None) for field in IGNORED],
        bases=(base,),
        kw_only=True,
        forbid_unknown_fields=True,
        module=__name__,
    )


CompletionBody = _with_ignored("CompletionBody", CompletionFields)


class ExtraChunk(msgspec.Struct, forbid_unknown_fields=True):
    """A piece of repository context for /infill: a file's text, put before the prefix."""

    text: str
    filename: str = "tmp"


class InfillFields(CompletionFields, kw_only=True):
    prompt: str = ""  # put after the prefix (llama-server's "prompt" of /infill: the text already typed in the middle)
    input_prefix: str | list[int | str]
    input_suffix: str | list[int | str]
    input_extra: list[ExtraChunk] = []


InfillBody = _with_ignored("InfillBody", InfillFields)


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    content: str
    add_special: bool = False  # BOS, as the model's file asks
    parse_special: bool = True  # <|im_end|> written out is one token
    with_pieces: bool = False


class TokenPiece(msgspec.Struct):
    id: int
    piece: str | list[int]  # the bytes when they are not whole UTF-8 characters


class TokenizeResult(msgspec.Struct):
    tokens: list[int | TokenPiece]


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    tokens: list[int]


class DetokenizeResult(msgspec.Struct):
    content: str


class SlotFileRequest(msgspec.Struct):
    """POST /slots/{id}?action=save|restore: the file, a name in --slot-save-path (other fields are ignored, as
    llama-server does)."""

    filename: str


class SaveTimings(msgspec.Struct):
    save_ms: float


class SlotSaved(msgspec.Struct):
    id_slot: int
    filename: str
    n_saved: int  # tokens whose cells the file holds
    n_written: int  # the file's bytes
    timings: SaveTimings


class RestoreTimings(msgspec.Struct):
    restore_ms: float


class SlotRestored(msgspec.Struct):
    id_slot: int
    filename: str
    n_restored: int
    n_read: int
    timings: RestoreTimings


class SlotErased(msgspec.Struct):
    id_slot: int
    n_erased: int
