"""Request bodies of Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens).

As on the OpenAI routes, a field not known here is dropped with a debug log
(frontend_proc.http.lenient), and those clients send routinely with no bearing on
the output (`metadata`, `service_tier`, `cache_control`, `context_management`,
...) are declared and ignored. `temperature`, `top_p` and
`top_k`, which newer SDKs no longer send, are read when given. Content blocks carry more keys than are read here
(`cache_control`, `citations`): those are ignored, so a conversation can be
sent back as the SDK or Claude Code keeps it. Image and document blocks are
decoded for the chat layer (images) or refused with a clear message (documents).

What real clients send beyond the docs is taken as the API means it, once
decoded (__post_init__): Claude Code's system-role messages inside `messages`
join the system prompt, in order, and its billing block leaves it; tools and content blocks of kinds not known
here (server tools, `tool_reference`, ...) are skipped (frontend_proc.http.lenient);
a tool with `defer_loading` is offered only once a `tool_reference` block
(what Claude Code's ToolSearch returns) names it, as Anthropic's tool search does.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from frontend_proc.core.sampling import Sampling
from frontend_proc.http.lenient import known


class TextBlock(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ImageBlock(msgspec.Struct, tag="image", tag_field="type"):
    source: dict


class DocumentBlock(msgspec.Struct, tag="document", tag_field="type"):
    source: dict


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict


class ToolResultBlock(msgspec.Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str | list[dict] = ""  # text, image and document blocks once decoded
    is_error: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.content, list):
            self.content = known(self.content, RESULT_BLOCKS, "content", "tool result block")


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(msgspec.Struct, tag="redacted_thinking", tag_field="type"):
    data: str


Block = TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
BLOCKS = {cls.__struct_config__.tag: cls for cls in Block.__args__}
RESULT_BLOCKS = {"text": TextBlock, "image": ImageBlock, "document": DocumentBlock}
# Claude Code's first system block: metadata for Anthropic's billing, not for the model. Its hash changes with
# every conversation's first prompt, so left in it would keep the prefix cache from reusing the ~12k tokens after it.
BILLING = "x-anthropic-billing-header:"


class Message(msgspec.Struct):
    role: Literal["user", "assistant", "system"]  # system: Claude Code's own, joined to the system prompt
    content: str | list[dict]  # blocks (Block) once decoded (_blocks)


class Tool(msgspec.Struct):
    name: Annotated[
        str, Meta(pattern="^[A-Za-z0-9_-]{1,128}$")
    ]  # Anthropic's rule: names go into prompts and grammars as they are
    input_schema: dict
    description: str | None = None
    defer_loading: bool = False  # offered once a tool_reference block names it


class ToolChoiceAuto(msgspec.Struct, tag="auto", tag_field="type", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(msgspec.Struct, tag="any", tag_field="type", forbid_unknown_fields=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(msgspec.Struct, tag="tool", tag_field="type", forbid_unknown_fields=True):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(msgspec.Struct, tag="none", tag_field="type", forbid_unknown_fields=True):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingEnabled(msgspec.Struct, tag="enabled", tag_field="type"):
    budget_tokens: Annotated[int, Meta(ge=1)] | None = None  # not enforced: the model decides when it is done


class ThinkingAdaptive(msgspec.Struct, tag="adaptive", tag_field="type"):
    pass


class ThinkingDisabled(msgspec.Struct, tag="disabled", tag_field="type"):
    pass


class JsonOutputFormat(msgspec.Struct, tag="json_schema", tag_field="type", forbid_unknown_fields=True):
    schema: dict


class OutputConfig(msgspec.Struct, forbid_unknown_fields=True):
    effort: str | None = None  # reaches templates as reasoning_effort
    format: JsonOutputFormat | None = None  # structured output, enforced by a grammar as on the OpenAI routes


class CountTokensRequest(Sampling, kw_only=True, forbid_unknown_fields=True):
    """The conversation; what /v1/messages/count_tokens reads (the sampling fields only /v1/messages uses)."""

    temperature: Annotated[float, Meta(ge=0, le=1)] = 1.0
    top_p: Annotated[float, Meta(ge=0, le=1)] = 1.0
    top_k: Annotated[int, Meta(ge=0, lt=1 << 31)] = 40

    model: str | None = None  # a model of the registry (None: the default); with one model, any name
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[dict] | None = None  # custom tools (Tool) once decoded; server tools are not run here
    tool_choice: ToolChoice | None = None
    thinking: ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled | None = None
    output_config: OutputConfig | None = None
    cache_control: dict | None = None  # prompt caching is automatic here (the prefix cache)
    context_management: dict | None = None  # Claude Code's; nothing here is cleared from a conversation

    def __post_init__(self) -> None:
        if isinstance(self.system, list):  # Claude Code's billing block differs from one conversation to the next
            self.system = "\n".join(b.text for b in self.system if not b.text.startswith(BILLING))
        system = [self.system] if self.system else []
        messages: list = []
        referenced: set[str] = set()
        for i, message in enumerate(self.messages):
            if isinstance(message.content, list):
                message.content = _blocks(message.content, f"messages[{i}].content", referenced)
            if message.role != "system":
                messages.append(message)
            elif text := _system_text(message.content, i):
                system.append(text)
        if not messages:
            raise ValueError("messages must hold a user or assistant message - at `$.messages`")
        self.messages = messages
        self.system = "\n\n".join(system) if system else None
        if self.tools is not None:
            tools = known(self.tools, {"custom": Tool}, "tools", "tool", default="custom")
            self.tools = [t for t in tools if not t.defer_loading or t.name in referenced]


def _blocks(raw: list, path: str, referenced: set[str]) -> list:
    """A message's content blocks, decoded; the tools its tool results' tool_reference blocks name go into
    ``referenced``."""
    for block in raw:
        if isinstance(block, dict) and block.get("type") == "tool_result" and isinstance(block.get("content"), list):
            referenced.update(
                b["tool_name"]
                for b in block["content"]
                if isinstance(b, dict) and b.get("type") == "tool_reference" and b.get("tool_name")
            )
    return known(raw, BLOCKS, path, "content block")


def _system_text(content: str | list, i: int) -> str:
    if isinstance(content, str):
        return content
    if any(not isinstance(b, TextBlock) for b in content):
        raise ValueError(f"a system message holds only text blocks - at `$.messages[{i}].content`")
    return "\n".join(b.text for b in content)


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1)]
    stop_sequences: Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=16)] | None = None
    stream: bool = False
    # Sent by clients, no bearing on the output here.
    metadata: dict | None = None
    service_tier: str | None = None
    container: str | None = None
    inference_geo: str | None = None
    speed: str | None = None
