"""Request bodies of the OpenAI-compatible API, validated by msgspec as they are decoded.

A bad field fails the decode with a message naming it, answered as a 400 in
OpenAI's error shape with that field as `param`.

A field no Struct here declares is what a newer client adds: it is dropped
with a debug log (frontend_proc.http.lenient), not refused. Fields OpenAI clients
send routinely that have no bearing on the output (`user`, `store`,
`metadata`, `service_tier`) are declared, so decoding them stays one pass.
Inside a message only `role`, `content`, `name`, `tool_calls` and
`tool_call_id` are read; other keys (`refusal`: null, as a previous
response's message carries it) are ignored. Beyond OpenAI's parameters, llama-server's
`top_k`, `min_p`, `repetition_penalty` and `ignore_eos` are accepted.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from cllm.core.protocol import SamplingParams
from frontend_proc.chat.images import from_url
from frontend_proc.chat.request import template_call
from frontend_proc.core.sampling import Sampling

StopString = Annotated[str, Meta(min_length=1)]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False


class TextFormat(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    pass


class JsonObjectFormat(msgspec.Struct, tag="json_object", tag_field="type", forbid_unknown_fields=True):
    pass


class JsonSchema(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    schema: dict = {}
    description: str | None = None
    strict: bool | None = None  # the schema is always enforced


class JsonSchemaFormat(msgspec.Struct, tag="json_schema", tag_field="type", forbid_unknown_fields=True):
    json_schema: JsonSchema


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class OpenAIRequest(Sampling, kw_only=True, forbid_unknown_fields=True):
    """The parameters both endpoints share (and the sampling fields every door reads, OpenAI's defaults over them)."""

    model: str | None = None  # None: the default model; a single model answers to any name
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Meta(ge=0, le=1)] = 1.0
    stop: StopString | Annotated[list[StopString], Meta(max_length=4)] | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[int, Annotated[float, Meta(ge=-100, le=100)]] | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # llama-server's extension: a GBNF grammar (start symbol root) the output must match
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else self.stop or []

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None) -> SamplingParams:
        """The sampling parameters, without a grammar (the chat layer adds it)."""
        return self.params(
            max_tokens, logit_bias=self.logit_bias or None, logprobs=logprobs, prompt_logprobs=prompt_logprobs
        )


class CompletionRequest(OpenAIRequest, kw_only=True):
    # A string, token ids, or a list of either (one choice set per prompt).
    prompt: str | list[str | int | list[int]]
    max_tokens: Annotated[int, Meta(ge=0)] | None = None  # 0 with echo: score the prompt, generate nothing
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Meta(ge=1)] | None = None


class TextPart(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    text: str


class ImageUrl(msgspec.Struct):
    url: str  # a data URI, or an http(s) URL the server fetches only when the operator allows it
    detail: str | None = None  # the image is read whole: ignored


class ImageUrlPart(msgspec.Struct, tag="image_url", tag_field="type"):
    image_url: ImageUrl


class MessageError(ValueError):
    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str  # JSON text, as the API returned it


class MessageToolCall(msgspec.Struct):
    id: str
    function: FunctionCall
    type: Literal["function"] = "function"

    def to_template(self) -> dict:
        return template_call(self.id, self.function.name, self.function.arguments)


class Message(msgspec.Struct):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImageUrlPart] | None = None  # null or absent only beside tool_calls
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool: the call it answers

    def to_template(self, index: int) -> dict:
        """The message as chat templates expect it; developer is the newer name of system.

        MessageError for a message that lacks what its role needs.
        """
        content: str | list | None = self.content
        if isinstance(content, list):
            content = parts(content, f"messages[{index}].content")
        if content is None and not self.tool_calls:
            raise MessageError(
                "content is required (it may be null only beside tool_calls)", f"messages[{index}].content"
            )
        message = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            if self.role != "assistant":
                raise MessageError("only assistant messages carry tool_calls", f"messages[{index}].tool_calls")
            message["tool_calls"] = [c.to_template() for c in self.tool_calls]
        if self.role == "tool":
            if self.tool_call_id is None:
                raise MessageError(
                    "a tool message needs the tool_call_id it answers", f"messages[{index}].tool_call_id"
                )
            message["tool_call_id"] = self.tool_call_id
        return message


def parts(content: list[TextPart | ImageUrlPart], param: str) -> str | list:
    """Text parts as one text; beside images, the chat layer's list of texts and images."""
    if all(isinstance(p, TextPart) for p in content):
        return "\n".join(p.text for p in content if isinstance(p, TextPart))
    return [
        p.text if isinstance(p, TextPart) else from_url(p.image_url.url, f"{param}[{i}].image_url.url")
        for i, p in enumerate(content)
    ]


class FunctionDef(msgspec.Struct, forbid_unknown_fields=True):
    # OpenAI's rule for names: they appear in prompts and grammars as they are.
    name: Annotated[str, Meta(min_length=1, max_length=64, pattern="^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None  # the schema is always enforced


class ToolDef(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str


class NamedToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(OpenAIRequest, kw_only=True):
    messages: Annotated[list[Message], Meta(min_length=1)]
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: Annotated[list[ToolDef], Meta(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # auto when there are tools
    parallel_tool_calls: bool = True
    # Reach the chat template: {"enable_thinking": false} turns Qwen3's thinking off; an effort reaches gpt-oss's.
    chat_template_kwargs: dict | None = None
    reasoning_effort: str | None = None
