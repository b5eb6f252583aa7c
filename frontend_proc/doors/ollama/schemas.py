"""Ollama's request bodies (its /api/ routes), as msgspec types.

Liberal as Ollama is: unknown fields, and options cllm has no use for
(num_thread, num_gpu, mirostat, ...), are ignored; a known field of the wrong
type is a 400.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from cllm.core.protocol import SamplingParams
from frontend_proc.core.sampling import REST, Sampling

# A Go duration ("5m", "1h30m", "300ms"), or a plain number of seconds.
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class Options(Sampling, kw_only=True):
    """The options Ollama samples with, over cllm's defaults; its names and bounds where they differ."""

    num_predict: Annotated[int, Meta(ge=-2)] | None = None  # -1: no limit, -2: fill the context
    top_k: Annotated[int, Meta(ge=0)] = 40
    seed: int | None = None  # negative: a random seed
    stop: list[str] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] = msgspec.field(default=1.0, name="repeat_penalty")
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    num_ctx: Annotated[int, Meta(ge=1)] | None = None

    def sampling(self) -> SamplingParams:
        """num_predict 0 or less, or none: what the sequence holds."""
        return self.params(self.num_predict if self.num_predict and self.num_predict > 0 else REST)

    def engine_seed(self) -> int | None:
        return self.seed if self.seed is not None and self.seed >= 0 else None


NO_OPTIONS = Options()


class CallFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: dict | str = msgspec.field(
        default_factory=dict
    )  # an object, as Ollama writes it (a JSON string taken too)


class ToolCall(msgspec.Struct, kw_only=True):
    function: CallFunction
    id: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: Annotated[str, Meta(min_length=1)]
    content: str = ""
    thinking: str | None = None  # of an earlier turn: not sent back to the model
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None  # on a tool message: the tool whose result it is
    tool_call_id: str | None = None


class Function(msgspec.Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]
    description: str | None = None
    parameters: dict | None = None


class Tool(msgspec.Struct, kw_only=True):
    function: Function
    type: str = "function"


class _Generating(msgspec.Struct, kw_only=True):
    model: Annotated[str, Meta(min_length=1)]
    format: Literal["", "json"] | dict | None = None  # "json": any JSON object; an object: a JSON schema
    options: Options | None = None
    stream: bool = True
    think: bool | Literal["high", "medium", "low"] | None = None  # a level: a reasoning effort (gpt-oss)
    keep_alive: str | float | None = None


class ChatBody(_Generating, kw_only=True):
    messages: list[Message] = msgspec.field(
        default_factory=list
    )  # none: only load (or, keep_alive 0, unload) the model
    tools: list[Tool] | None = None


class GenerateBody(_Generating, kw_only=True):
    prompt: str = ""  # empty: only load (or, keep_alive 0, unload) the model
    suffix: str | None = None  # fill in the middle, between prompt and suffix
    system: str | None = None
    template: str | None = None
    raw: bool = False  # the prompt is sent as it is, without the chat template
    images: list[str] | None = None
    context: list[int] | None = None  # Ollama's deprecated conversation memory: ignored (send messages to /api/chat)


class EmbedBody(msgspec.Struct, kw_only=True):
    model: Annotated[str, Meta(min_length=1)]
    input: str | Annotated[list[str], Meta(min_length=1)]
    truncate: bool = True
    options: Options | None = None
    keep_alive: str | float | None = None


class EmbeddingsBody(msgspec.Struct, kw_only=True):
    """The older /api/embeddings: one prompt, one vector."""

    model: Annotated[str, Meta(min_length=1)]
    prompt: Annotated[str, Meta(min_length=1)]
    options: Options | None = None
    keep_alive: str | float | None = None


class ShowBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # older clients' name for it
    verbose: bool = False


def seconds(keep_alive: str | float | None) -> float | None:
    """keep_alive in seconds (negative: forever; None: not given); ValueError if it is not a duration."""
    if keep_alive is None or isinstance(keep_alive, (int, float)):
        return keep_alive
    text = keep_alive.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"keep_alive {keep_alive!r} is not a duration (such as 5m, 1h30m, 0 or -1)")
    return sum(float(n) * _UNIT[u] for n, u in parts)
