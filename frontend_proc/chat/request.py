"""One chat request in cllm's own terms: what every chat door translates its body into.

A door (OpenAI chat completions, Anthropic Messages, OpenAI Responses, and
the next one) reads its wire format into a ChatRequest and hands it to
frontend_proc.chat.turn; nothing below the doors knows any door's schemas. The
messages are those chat templates know: role, content (a string, or a list of strings and
frontend_proc.chat.images.Image parts), and for calls `tool_calls` on an assistant message and
`tool_call_id` on a tool message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from cllm.core.errors import ApiError, invalid
from cllm.core.protocol import SamplingParams
from frontend_proc.chat.tools import Tool
from frontend_proc.core.output import GrammarOutput, JsonOutput


def not_text(kind: str, param: str) -> ApiError:
    """A document, a file: a chat is text and images (frontend_proc.chat.images)."""
    return invalid(f"{kind} input is not supported: send text (and images, to a model with a projector)", param)


@dataclass(frozen=True, slots=True)
class Fields:
    """Where a door's body carries each part, for the `param` of a 400."""

    messages: str = "messages"
    output: str = "response_format"
    tool_schema: str = "tools[{}].function.parameters"  # of the i-th tool
    max_tokens: str = "max_tokens"  # the field the client set the limit with


@dataclass(slots=True, kw_only=True)
class ChatRequest:
    messages: list[dict]
    # The door's sampling fields (Sampling.params; max_tokens REST: what the sequence holds); the chat layer adds
    # the grammar.
    sampling: SamplingParams
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str = "auto"  # none, auto, required, or a tool's name
    parallel_tool_calls: bool = True
    output: JsonOutput | GrammarOutput | None = None  # None: free text
    thinking: bool | None = None  # False turns thinking off (Qwen3's enable_thinking)
    effort: str | None = None  # a reasoning effort (gpt-oss's reasoning_effort)
    template_kwargs: dict | None = None  # more template variables, as the client sent them
    n: int = 1
    stops: Sequence[str] = ()
    stream: bool = False
    fields: Fields = Fields()

    def template_context(self) -> dict:
        """The template variables the request sets."""
        context = dict(self.template_kwargs or {})
        if self.thinking is not None:
            context.setdefault("enable_thinking", self.thinking)
        if self.effort is not None:
            context.setdefault("reasoning_effort", self.effort)
            if self.effort == "none":
                context.setdefault("enable_thinking", False)
        return context


def template_call(call_id: str, name: str, arguments: str | dict) -> dict:
    """A call as templates expect it: the arguments as an object when they are JSON (transformers, llama.cpp)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool(name: str, description: str | None, parameters: dict | None) -> Tool:
    """A tool of the request; no (or empty) parameters: it takes none."""
    return Tool(name, description, json.dumps(parameters or {"type": "object", "properties": {}}))
