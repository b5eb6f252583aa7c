"""OpenAI chat's side of tool calling: its request fields in, its message and delta shapes out.

The work is frontend_proc.tools (prompt, grammar) and frontend_proc.tool_parser
(reading calls back); this module only translates OpenAI's `tools`,
`tool_choice` and messages into them, and the parser's events into
`message.tool_calls` and streamed `delta.tool_calls`.
"""

from __future__ import annotations

import json

from frontend_proc.chat import render
from frontend_proc.chat_template import ChatTemplate
from cllm.core.errors import ApiError
from frontend_proc.openai_schemas import ChatCompletionRequest, MessageError
from frontend_proc.tool_parser import call_parser
from frontend_proc.tools import Tool, ToolError, ToolFormat, ToolPlan, plan


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, "invalid request", message, param=param)


def chat_plan(body: ChatCompletionRequest, template: ChatTemplate, vocab) -> ToolPlan:
    tools = [
        Tool(t.function.name, t.function.description, json.dumps(t.function.parameters or {"type": "object", "properties": {}}))
        for t in body.tools or ()
    ]
    choice = body.tool_choice or "auto"
    if not isinstance(choice, str):
        choice = choice.function.name
        if not tools:
            raise _invalid("tool_choice names a tool, but the request has no tools", "tool_choice")
    elif choice == "required" and not tools:
        raise _invalid("tool_choice is required, but the request has no tools", "tool_choice")
    fmt = ToolFormat.detect(template.source, template.renders_tools)
    try:
        return plan(tools, choice, body.parallel_tool_calls, fmt, vocab)
    except ToolError as e:
        raise _invalid(str(e), e.param) from None


def chat_prompt(body: ChatCompletionRequest, template: ChatTemplate, tool_plan: ToolPlan, context: dict | None = None) -> str:
    """The messages rendered with the model's template, the tools as the plan says (context: template variables)."""
    try:
        messages = [m.to_template(i) for i, m in enumerate(body.messages)]
    except MessageError as e:
        raise _invalid(str(e), e.param) from None
    return render(template, messages, context, "messages", tool_plan)


class ChatOutput:
    """One choice's text read for tool calls, as OpenAI's message or deltas."""

    def __init__(self, tool_plan: ToolPlan):
        self.parser = call_parser(tool_plan.format) if tool_plan.parse else None

    def message(self, text: str) -> dict:
        if self.parser is None:
            return {"role": "assistant", "content": text}
        events = self.parser.feed(text) + self.parser.finish()
        content = "".join(e for e in events if isinstance(e, str))
        calls = self.parser.calls
        if not calls:
            return {"role": "assistant", "content": content}
        tool_calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return {"role": "assistant", "content": content if content.strip() else None, "tool_calls": tool_calls}

    def deltas(self, text: str | None) -> list[dict]:
        """The deltas a piece of text makes (None: the end of the text); several, as a call opens then fills."""
        if self.parser is None:
            return [{"content": text}] if text is not None else []
        events = self.parser.feed(text) if text is not None else self.parser.finish()
        out: list[dict] = []
        for e in events:
            if isinstance(e, str):
                if out and "content" in out[-1]:
                    out[-1]["content"] += e
                else:
                    out.append({"content": e})
            elif e.id is not None:
                function = {"name": e.name, "arguments": ""}
                out.append({"tool_calls": [{"index": e.index, "id": e.id, "type": "function", "function": function}]})
            else:
                out.append({"tool_calls": [{"index": e.index, "function": {"arguments": e.arguments}}]})
        return out

    def finish_reason(self, finish: str | None) -> str | None:
        return "tool_calls" if finish == "stop" and self.parser is not None and self.parser.calls else finish

