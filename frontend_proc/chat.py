"""What every chat route does alike: a conversation to prompt tokens, and the reply read back as parts.

/v1/chat/completions, /v1/messages and /v1/responses take conversations in
three shapes; each turns its own into the messages chat templates know
(role, content; tool_calls and tool messages) and calls render(), with the
ToolPlan its tools ask for (frontend_proc.tools). A Reply then reads the
reply's text as it grows: thinking apart from the answer
(frontend_proc.reasoning), then tool calls out of the answer
(frontend_proc.tool_parser), as (REASONING, text), (CONTENT, text) and
(CALL, ToolCallDelta) parts, which each route writes out in its own shapes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from cllm.core.protocol import SamplingParams
from frontend_proc import generation

from frontend_proc.app import AppState
from frontend_proc.chat_template import ChatTemplate, ChatTemplateError
from cllm.core.errors import ApiError
from frontend_proc.generation import Generation
from frontend_proc.grammar import GrammarError, response_format_grammar
from frontend_proc.openai_schemas import ResponseFormat
from frontend_proc.reasoning import CONTENT, HARMONY_TOKENS, Splitter, is_harmony, splitter_factory
from frontend_proc.tokenizer import Tokenizer
from frontend_proc.tool_parser import ToolCall, call_parser
from frontend_proc.tools import Tool, ToolError, ToolFormat, ToolPlan, generic_messages, plan

CALL = "call"  # a part that is a ToolCallDelta


def invalid(message: str, param: str) -> ApiError:
    return ApiError(400, "invalid request", message, param=param)


def render(template: ChatTemplate, messages: list[dict], context: dict | None, param: str, tool_plan: ToolPlan | None = None) -> str:
    """The prompt text: the messages with the template, the tools as the plan says."""
    tools = None
    if tool_plan is not None:
        tools = tool_plan.template_tools
        if not tool_plan.format.native:
            messages = generic_messages(messages, tool_plan.system_text, template.renders_tool_role)
    try:
        return template.render(messages, tools=tools, context=context)
    except ChatTemplateError as e:
        raise invalid(str(e), param) from None


def tool_plan(st: AppState, tools: list[Tool], choice: str, parallel: bool, param: str) -> ToolPlan:
    """The plan for a request's tools (choice: none, auto, required or a tool's name); param: where the tools are."""
    fmt = ToolFormat.detect(st.chat_template.source, st.chat_template.renders_tools)
    try:
        return plan(tools, choice, parallel, fmt, st.tokenizer.vocab)
    except ToolError as e:
        # tools.py names OpenAI chat's fields (tools[i].function.parameters): say where they are in this API.
        raise invalid(str(e), e.param.replace("tools", param, 1).replace(".function.parameters", "")) from None


class ChatPrompt:
    """A rendered conversation: its tokens, and how to read the reply."""

    def __init__(self, st: AppState, text: str, tool_plan: ToolPlan | None = None):
        self.tokens = st.tokenizer.encode(text)
        self.tool_plan = tool_plan
        harmony = is_harmony(st.chat_template.source)
        calls = tool_plan is not None and tool_plan.parse
        self._new_splitter = splitter_factory(text, harmony, calls) if st.config.reasoning_format == "auto" else None
        # The reply's text must show the control tokens it is read by: a tool-call opener, harmony's markers.
        shown = shown_tokens(tool_plan, st.tokenizer) if tool_plan is not None else frozenset()
        self.shown = (shown | st.tokenizer.control_tokens(HARMONY_TOKENS)) if harmony else shown

    def splitter(self) -> Splitter | None:
        """A splitter for one reply; None when thinking is left in the text (--reasoning-format none)."""
        return self._new_splitter() if self._new_splitter is not None else None

    def split(self, text: str) -> list[tuple[str, str]]:
        """The reasoning and answer parts of a whole reply."""
        splitter = self.splitter()
        if splitter is None:
            return [(CONTENT, text)]
        return splitter.feed(text) + splitter.flush()

    def reply(self) -> Reply:
        return Reply(self.splitter(), self.tool_plan)

    async def start(self, st: AppState, sampling: SamplingParams, *, stops: Sequence[str] = (), stream: bool, param: str) -> Generation:
        """Generate the reply down the one path."""
        return await generation.start(st, [self.tokens], sampling, stops=stops, stream=stream, prompt_param=param, shown=self.shown)


async def reply_parts(gen: Generation, reply: Reply) -> AsyncIterator[list[tuple]]:
    """The parts of the first choice's reply as it grows (one list per text piece, then the rest)."""
    async for _, piece in gen.pieces():
        yield reply.feed(piece)


def constraint(output: str | None, plan: ToolPlan | None, ignore_eos: bool, format_param: str) -> tuple[str | None, list[str] | None]:
    """The grammar and its triggers: the JSON output format's, or the tools' (one grammar per sequence)."""
    grammar, triggers = output, None
    if plan is not None and plan.grammar is not None:
        if output is not None:
            raise invalid(f"{format_param} cannot be combined with tools unless tool_choice is none", format_param)
        grammar, triggers = plan.grammar, plan.triggers
    if grammar is not None and ignore_eos:  # the grammar's end can only be followed by an end-of-generation token
        raise invalid("ignore_eos cannot be combined with a JSON output format or tool calls", "ignore_eos")
    return grammar, triggers


class Reply:
    """One reply read piece by piece: thinking apart, then tool calls out of the answer."""

    def __init__(self, splitter: Splitter | None, tool_plan: ToolPlan | None):
        self._splitter = splitter
        self._parser = call_parser(tool_plan.format) if tool_plan is not None and tool_plan.parse else None

    @property
    def calls(self) -> list[ToolCall]:
        return self._parser.calls if self._parser is not None else []

    def feed(self, text: str | None) -> list[tuple]:
        """The parts a piece of text makes; None: the reply is over."""
        if self._splitter is None:
            parts = [(CONTENT, text)] if text else []
        else:
            parts = self._splitter.feed(text) if text is not None else self._splitter.flush()
        if self._parser is None:
            return parts
        out: list[tuple] = []
        for kind, part in parts:
            if kind == CONTENT:
                out += _read(self._parser.feed(part))
            else:
                out.append((kind, part))
        if text is None:
            out += _read(self._parser.finish())
        return out

    def whole(self, text: str) -> list[tuple]:
        """The parts of a whole reply, consecutive text of one kind joined."""
        merged: list[tuple] = []
        for kind, part in self.feed(text) + self.feed(None):
            if kind != CALL and merged and merged[-1][0] == kind:
                merged[-1] = (kind, merged[-1][1] + part)
            else:
                merged.append((kind, part))
        return merged


def _read(events: list) -> list[tuple]:
    return [(CONTENT, e) if isinstance(e, str) else (CALL, e) for e in events]


def shown_tokens(tool_plan: ToolPlan, tokenizer: Tokenizer) -> frozenset[int]:
    """The call opener, when it is a control token (Mistral's [TOOL_CALLS]): the text must show it to the parser."""
    opener = tool_plan.format.opener
    token = tokenizer.control_token(opener) if tool_plan.parse and opener else None
    return frozenset(() if token is None else (token,))


def template_context(thinking: bool | None = None, effort: str | None = None, kwargs: dict | None = None) -> dict:
    """The template variables a request sets: thinking off (Qwen3's enable_thinking), an effort (gpt-oss's)."""
    context = dict(kwargs or {})
    if thinking is not None:
        context.setdefault("enable_thinking", thinking)
    if effort is not None:
        context.setdefault("reasoning_effort", effort)
        if effort == "none":
            context.setdefault("enable_thinking", False)
    return context


def not_text(kind: str, param: str) -> ApiError:
    """An image, a file: the served model reads text only."""
    return invalid(f"{kind} input is not supported: the served model reads text only", param)


def output_grammar(st: AppState, fmt: ResponseFormat | None, param: str) -> str | None:
    """The grammar of a JSON output format (None: free text); a schema llama.cpp cannot enforce is a 400."""
    try:
        return response_format_grammar(fmt, st.tokenizer.vocab)
    except GrammarError as e:
        raise invalid(str(e), param) from None


def join(parts: list[tuple], kind: str) -> str:
    return "".join(text for k, text in parts if k == kind)
