"""Tool calling, whatever the API: the prompt and the grammar a request's tools ask for.

An API route (OpenAI chat, Anthropic Messages, OpenAI Responses) turns its
request into `Tool`s and a choice (`"none"`, `"auto"`, `"required"` or a tool's
name), asks `plan()` for a `ToolPlan`, renders its messages with it and sends
its grammar with the sampling parameters; `frontend_proc.chat.tool_parser` then
reads the calls back out of the text. Only the formatting is the route's.

How a model is prompted and which syntax it writes its calls in depends on its
chat template (`ToolFormat.detect`): Hermes/Qwen templates get the tools and
write `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, Llama 3.x a bare
`{"name": ..., "parameters": ...}`, Mistral `[TOOL_CALLS][{...}]`, gpt-oss a
harmony message to the function (`<|channel|>commentary to=functions.f
<|constrain|>json<|message|>{...}`). A template
that does not render tools gets the generic form: the tools and the call syntax
(Hermes's tags) described in the system turn, and earlier calls and results
written into the conversation as text.

The grammar makes every call well-formed: its `arguments` match the tool's
`parameters`. With `required` or a named tool it constrains the whole output;
with `auto` it is lazy: llama.cpp's sampler applies it from the moment the text
matches a trigger pattern (the call's opening), so free text stays free. A
count in a tool's schema above COUNT_MAX (Claude Code's Workflow tool takes a
script of up to 524288 characters) is left out of the grammar, not refused: a
grammar writes one rule per unit of a count, the request's agent did not choose
its tools' schemas, and no reply of a local model nears such a bound.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from functools import lru_cache

from llama_cpp.llama_grammar import SchemaConverter

from frontend_proc.core.grammar import MAX_REPEATS, GrammarError, check, schema_grammar, schema_repeats

log = logging.getLogger("cllm.frontend")
COUNT_MAX = 1024  # larger counts (maxLength, maxItems, ...) in a tool's schema are not enforced by its grammar
COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
# Where a schema holds schemas, and the keys by which llama.cpp's converter tells what a schema is.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMAS = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames")
TYPED = {
    "type",
    "$ref",
    "anyOf",
    "oneOf",
    "allOf",
    "const",
    "enum",
    "properties",
    "additionalProperties",
    "items",
    "prefixItems",
    "pattern",
    "format",
}
ANY = ["string", "number", "boolean", "object", "array", "null"]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str | None
    parameters: str  # the JSON schema of the arguments, as JSON text (hashable, for the grammar cache)

    def as_openai(self) -> dict:
        """The tool as chat templates expect it (transformers passes OpenAI's shape)."""
        function = {"name": self.name, "description": self.description, "parameters": json.loads(self.parameters)}
        if self.description is None:
            del function["description"]
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """How one family of models writes a call."""

    name: str
    opener: str  # what starts the calls in the text ("" for Llama 3.x: a JSON object at the start)
    closer: str  # what ends each call ("" when the JSON object's end does)
    args_key: str  # the key of the arguments in the call object
    array: bool  # the calls are a JSON array after the opener (Mistral)
    native: bool  # the template renders tools and calls itself

    @staticmethod
    def detect(template_source: str, renders_tools: bool) -> ToolFormat:
        if renders_tools and "<|channel|>" in template_source:  # harmony, as reasoning.is_harmony
            return HARMONY
        if renders_tools and "<tool_call>" in template_source:
            return HERMES
        if renders_tools and "[TOOL_CALLS]" in template_source:
            return MISTRAL
        if renders_tools and "<|start_header_id|>" in template_source:
            return LLAMA3
        return GENERIC


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments", array=False, native=True)
LLAMA3 = ToolFormat("llama3", "", "", "parameters", array=False, native=True)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", "", "arguments", array=True, native=True)
GENERIC = ToolFormat("generic", "<tool_call>", "</tool_call>", "arguments", array=False, native=False)
# A message's recipient starts the call, its text is the arguments (harmony_grammar, tool_parser.HarmonyCallParser).
HARMONY = ToolFormat("harmony", "to=functions.", "", "", array=False, native=True)


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools add: to the prompt, to the sampling, to the reading of the output."""

    format: ToolFormat
    template_tools: list[dict] | None  # passed to a native template as `tools`
    system_text: str | None  # the generic form's description, added to the system turn
    grammar: str | None  # GBNF the calls must match
    triggers: list[str] | None  # regexes that start a lazy grammar (auto); None: from the first token
    parse: bool  # read calls out of the output (not with tool_choice none)


def plan(tools: list[Tool], choice: str, parallel: bool, fmt: ToolFormat, vocab) -> ToolPlan:
    """The plan for these tools and this choice; ToolError for what cannot be enforced.

    `choice` is "none", "auto", "required" or the name of one of the tools.
    A ToolError's `param` names the field in OpenAI chat's terms
    (`tools[i].function.parameters`), its `index` the tool: other APIs rename it.
    """
    if not tools or choice == "none":
        return ToolPlan(fmt, None, None, None, None, parse=False)
    names = [t.name for t in tools]
    if choice not in ("auto", "required") and choice not in names:
        raise ToolError(
            f"tool_choice names `{choice}`, which is not one of the tools ({', '.join(names)})", "tool_choice"
        )
    enforced = [_enforceable(t) for t in tools]
    for i, tool in enumerate(enforced):  # each schema alone, so the 400 says which tool is at fault
        try:
            schema_grammar(json.loads(tool.parameters), vocab)
        except GrammarError as e:
            raise ToolError(str(e), f"tools[{i}].function.parameters", i) from None
    allowed = tuple(t for t in enforced if t.name == choice) if choice not in ("auto", "required") else tuple(enforced)
    if fmt is HARMONY:  # one call a reply: <|call|> ends the generation
        grammar = harmony_grammar(allowed, choice == "auto", vocab)
    else:
        grammar = call_grammar(allowed, fmt, parallel and choice in ("auto", "required"), vocab)
    triggers = [trigger_pattern(fmt)] if choice == "auto" else None
    if fmt.native:
        return ToolPlan(fmt, [t.as_openai() for t in tools], None, grammar, triggers, parse=True)
    return ToolPlan(fmt, None, generic_system_text(tools, choice), grammar, triggers, parse=True)


def _enforceable(tool: Tool) -> Tool:
    """The tool as its grammar enforces it (the prompt shows the schema as sent): counts above COUNT_MAX left out, and a
    schema of annotations only (`{"description": ...}`: any value), which llama.cpp's converter refuses, made
    explicit."""
    schema = json.loads(tool.parameters)
    changes: list[str] = []
    todo = [schema]
    while todo:  # iterative, as grammar.schema_repeats
        node = todo.pop()
        for key in COUNTS:
            if type(node.get(key)) is int and node[key] > COUNT_MAX:
                changes.append(f"{key} {node.pop(key)}")
        if node and not node.keys() & TYPED:
            node["type"] = ANY
            changes.append("any value")
        for key, value in node.items():
            if key in SCHEMA_MAPS and isinstance(value, dict):
                todo.extend(v for v in value.values() if isinstance(v, dict))
            elif key in SCHEMA_LISTS and isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, dict))
            elif key in SCHEMAS and isinstance(value, dict):
                todo.append(value)
            elif key == "items" and isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, dict))
    if not changes:
        return tool
    log.debug(
        "a tool's schema loosened for its grammar", extra={"fields": {"tool": tool.name, "changes": ", ".join(changes)}}
    )
    return Tool(tool.name, tool.description, json.dumps(schema))


class ToolError(ValueError):
    def __init__(self, message: str, param: str, index: int | None = None):
        super().__init__(message)
        self.param = param
        self.index = index  # of the tool at fault (its parameters), if one is


def trigger_pattern(fmt: ToolFormat) -> str:
    """The regex whose match starts the lazy grammar; the grammar reads the text from its first group."""
    if fmt is HARMONY:  # a recipient right after a header (role's or channel's), not one the reasoning mentions
        return r"(?:^|<\|start\|>assistant|<\|channel\|>(?:commentary|analysis))\s*(to=functions\.)"
    if fmt.opener:
        return f"({re.escape(fmt.opener)})"
    return r"^\s*(\{)[\s\S]*$"  # Llama 3.x: the output opens with a JSON object


@lru_cache(maxsize=64)  # an agent sends the same tools every turn
def call_grammar(tools: tuple[Tool, ...], fmt: ToolFormat, parallel: bool, vocab) -> str:
    """GBNF for one call (or several, if parallel) to one of the tools, in the format's syntax."""
    defs: dict = {}
    variants = []
    for tool in tools:
        params = json.loads(tool.parameters)
        defs.update(params.pop("$defs", {}))  # refs point at the root: lift the definitions there
        defs.update(params.pop("definitions", {}))
        variants.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, fmt.args_key: params or {"type": "object"}},
                "required": ["name", fmt.args_key],
            }
        )
    schema: dict = variants[0] if len(variants) == 1 else {"anyOf": variants}
    if defs:
        schema = {**schema, "$defs": defs}
    if schema_repeats(schema) > MAX_REPEATS:
        raise ToolError(f"the tools' schemas ask for more than {MAX_REPEATS} repeated items in all", "tools")
    converter = _converter()
    _visit(converter, schema, "call")
    if fmt.array:
        one = '"[" space call (space "," space call)* space "]"' if parallel else '"[" space call space "]"'
        root = f"{_literal(fmt.opener)} {one}"
    else:
        one = f"{_literal(fmt.opener)} tool-ws call tool-ws {_literal(fmt.closer)}" if fmt.opener else "call"
        root = f"{one} (tool-ws {one})*" if parallel else one
    converter._add_rule("tool-ws", "[ \\t\\n]{0,3}")  # models write a newline or two around the JSON
    return _grammar(converter, root, vocab)


# After `to=functions.NAME`: the channel (when the role's header named the recipient), then the constraint.
_HARMONY_HEADER = '("<|channel|>" ("commentary" | "analysis"))? " "? ("<|constrain|>"? "json")? "<|message|>"'


@lru_cache(maxsize=64)
def harmony_grammar(tools: tuple[Tool, ...], lazy: bool, vocab) -> str:
    """GBNF for one call in harmony's syntax: from its recipient (lazy, the trigger) or the reply's first token."""
    converter = _converter()
    calls = []
    for i, tool in enumerate(tools):
        params = json.loads(tool.parameters) or {"type": "object"}
        if schema_repeats(params) > MAX_REPEATS:
            raise ToolError(f"the tools' schemas ask for more than {MAX_REPEATS} repeated items in all", "tools")
        args = _visit(converter, params, f"args-{i}")
        calls.append(converter._add_rule(f"call-{i}", f"{_literal(tool.name)} harmony-header {args}"))
    converter._add_rule("harmony-header", _HARMONY_HEADER)
    call = f"{_literal(HARMONY.opener)} ({' | '.join(calls)})"
    # Forced: the reply (after the prompt's `<|start|>assistant`) is the call, on the commentary channel.
    return _grammar(converter, call if lazy else f'"<|channel|>commentary " {call}', vocab)


def _converter() -> SchemaConverter:
    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _visit(converter: SchemaConverter, schema: dict, name: str) -> str:
    """The schema's rule, named name; a ToolError for what the converter cannot express."""
    try:
        return converter.visit(converter.resolve_refs(schema, "tools"), name)
    except Exception as e:  # the converter asserts on what it cannot express
        raise ToolError(f"unsupported JSON schema: {e}", "tools") from None


def _grammar(converter: SchemaConverter, root: str, vocab) -> str:
    """The whole grammar with this root, checked by llama.cpp's parser."""
    converter._add_rule("root", root)
    gbnf = converter.format_grammar()
    try:
        check(gbnf, vocab)
    except GrammarError as e:
        raise ToolError(str(e), "tools") from None
    return gbnf


def _literal(text: str) -> str:
    return json.dumps(text)  # a GBNF literal escapes as JSON does for these characters


def generic_system_text(tools: list[Tool], choice: str) -> str:
    """The generic form: the tools and the call syntax, for a template that does not render tools."""
    listing = "\n".join(json.dumps(t.as_openai()["function"], ensure_ascii=False) for t in tools)
    if choice == "auto":
        rule = "When a tool would help, call it; otherwise answer normally."
    elif choice == "required":
        rule = "You must call one of the tools."
    else:
        rule = f"You must call the tool `{choice}`."
    return (
        f"You can call these tools:\n{listing}\n{rule} To call a tool, write exactly:\n"
        '<tool_call>{"name": "<tool name>", "arguments": {<the arguments, as JSON>}}</tool_call>'
    )


def generic_messages(messages: list[dict], system_text: str | None, tool_role: bool) -> list[dict]:
    """Messages for a template without tool support: calls as text, the tools in the system turn.

    A result stays a `tool` message if the template renders that role (ChatML
    templates write any role), else it becomes a user turn in <tool_response>.
    """
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(
                "<tool_call>"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False
                )
                + "</tool_call>"
                for c in m["tool_calls"]
            )
            text = (m.get("content") or "") + ("\n" if m.get("content") else "") + calls
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool" and not tool_role:
            out.append({"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"})
        else:
            out.append(m)
    if system_text:
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system_text}"}
        else:
            out.insert(0, {"role": "system", "content": system_text})
    return out
