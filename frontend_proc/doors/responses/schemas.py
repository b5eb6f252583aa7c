"""Request bodies of OpenAI's Responses API (POST /v1/responses).

`input` is a string or a list of items. A message item may leave out its
`type` (the SDK's "easy" input message), so items are decoded one by one by
their type (item()), each error naming the item at fault. As on the other
OpenAI routes a field not known here is dropped with a debug log; fields Codex
CLI and the Agents SDK send routinely that change nothing here (`include`,
`prompt_cache_key`, `truncation`, `client_metadata`, ...) are declared and ignored. Inside an
item, keys other than those read (`id`, `status`, `annotations`) are ignored,
so a previous response's output can be sent back as it came. Tools and
content parts of kinds not known here (Codex CLI's `namespace` and
`web_search` tools, ...) are skipped (frontend_proc.http.lenient): only function
tools are offered to the model.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from cllm.core.errors import ApiError
from frontend_proc.core.sampling import Sampling
from frontend_proc.http.lenient import known


class InputText(msgspec.Struct, tag="input_text", tag_field="type"):
    text: str


class OutputText(msgspec.Struct, tag="output_text", tag_field="type"):
    text: str


class InputImage(msgspec.Struct, tag="input_image", tag_field="type"):
    image_url: str | None = None  # a data URI, or an http(s) URL fetched only where the operator allows it
    file_id: str | None = None  # of OpenAI's Files API, which this server has not


class InputFile(msgspec.Struct, tag="input_file", tag_field="type"):
    pass


class Refusal(msgspec.Struct, tag="refusal", tag_field="type"):
    refusal: str


Part = InputText | OutputText | InputImage | InputFile | Refusal
PARTS = {cls.__struct_config__.tag: cls for cls in Part.__args__}


class MessageItem(msgspec.Struct):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict]  # parts (Part) once decoded

    def __post_init__(self) -> None:
        if isinstance(self.content, list):
            self.content = known(self.content, PARTS, "content", "content part")


class FunctionCallItem(msgspec.Struct):
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(msgspec.Struct):
    call_id: str
    output: str | list[dict]  # parts (Part) once decoded

    def __post_init__(self) -> None:
        if isinstance(self.output, list):
            self.output = known(self.output, PARTS, "output", "content part")


class ReasoningItem(msgspec.Struct):
    """An earlier turn's reasoning: accepted and not sent back to the model (as Anthropic's thinking blocks)."""


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
ITEM_TYPES: dict[str, type] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def item(raw, param: str) -> Item:
    """One input item, by its type (a message may leave it out)."""
    if not isinstance(raw, dict):
        raise ApiError(400, "invalid request", "an input item must be an object", param=param)
    kind = raw.get("type", "message")
    type_ = ITEM_TYPES.get(kind)
    if type_ is None:
        raise ApiError(
            400,
            "invalid request",
            f"input items of type {kind!r} are not supported ({', '.join(ITEM_TYPES)} are)",
            param=param,
        )
    try:
        return msgspec.convert({k: v for k, v in raw.items() if k != "type"}, type_)
    except msgspec.ValidationError as e:
        raise ApiError(400, "invalid request", str(e), param=param) from None


class FormatText(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    pass


class FormatJsonObject(msgspec.Struct, tag="json_object", tag_field="type", forbid_unknown_fields=True):
    pass


class FormatJsonSchema(msgspec.Struct, tag="json_schema", tag_field="type", forbid_unknown_fields=True):
    name: str
    schema: dict
    description: str | None = None
    strict: bool | None = None  # the schema is always enforced


class TextConfig(msgspec.Struct, forbid_unknown_fields=True):
    format: FormatText | FormatJsonObject | FormatJsonSchema | None = None  # None: text
    verbosity: str | None = None


class FunctionTool(msgspec.Struct, tag="function", tag_field="type"):
    name: Annotated[
        str, Meta(pattern="^[A-Za-z0-9_.-]{1,64}$")
    ]  # OpenAI's rule: names go into prompts and grammars as they are
    parameters: dict | None = None
    description: str | None = None
    strict: bool | None = None


class FunctionChoice(msgspec.Struct, tag="function", tag_field="type", forbid_unknown_fields=True):
    name: str


class Reasoning(msgspec.Struct, forbid_unknown_fields=True):
    effort: str | None = None  # reaches templates as reasoning_effort; "none" turns thinking off
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(Sampling, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None  # a model of the registry (None: the default); with one model, any name
    input: str | list = ""
    instructions: str | None = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Meta(ge=0, le=1)] = 1.0
    top_k: Annotated[int, Meta(ge=0, lt=1 << 31)] = 40
    tools: list[dict] | None = None  # function tools (FunctionTool) once decoded; others are not run here
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice = "auto"
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    # Sent by clients, no bearing on the output here.
    user: str | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    truncation: str | None = None
    stream_options: dict | None = None
    client_metadata: dict | None = None  # Codex CLI's
    background: Literal[False] = False

    def __post_init__(self) -> None:
        if self.tools is not None:
            self.tools = known(self.tools, {"function": FunctionTool}, "tools", "tool")
