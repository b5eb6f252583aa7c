"""What every chat route does alike: a conversation to prompt tokens, and the reply split into parts.

/v1/chat/completions, /v1/messages and /v1/responses take conversations in
three shapes; each turns its own into the messages chat templates know
(role, content; tool_calls and tool messages) and calls render(). parts()
then turns the reply's text pieces into (REASONING | CONTENT, text) parts,
which each route writes out in its own events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from frontend_proc.app import AppState
from frontend_proc.chat_template import ChatTemplateError
from frontend_proc.errors import ApiError
from frontend_proc.generation import Generation
from frontend_proc.reasoning import CONTENT, ReasoningSplitter, opened_in_prompt


class ChatPrompt:
    """A rendered conversation: its tokens, and how to read the reply."""

    def __init__(self, st: AppState, messages: list[dict], context: dict, param: str):
        try:
            text = st.chat_template.render(messages, context=context)
        except ChatTemplateError as e:
            raise ApiError(400, "invalid request", str(e), param=param) from None
        self.tokens = st.tokenizer.encode(text)
        self._split = st.config.reasoning_format == "auto"
        self._closing = opened_in_prompt(text) if self._split else None

    def splitter(self) -> ReasoningSplitter | None:
        """A splitter for one reply; None when thinking is left in the text (--reasoning-format none)."""
        return ReasoningSplitter(self._closing) if self._split else None

    def split(self, text: str) -> list[tuple[str, str]]:
        """The parts of a whole reply."""
        splitter = self.splitter()
        if splitter is None:
            return [(CONTENT, text)]
        return splitter.feed(text) + splitter.flush()

    async def parts(self, gen: Generation) -> AsyncIterator[list[tuple[str, str]]]:
        """The parts of the first choice's reply as it grows (one list per text piece, then the rest)."""
        splitter = self.splitter()
        async for _, piece in gen.pieces():
            if splitter is None:
                yield [(CONTENT, piece)] if piece else []
            elif piece is None:
                yield splitter.flush()
            else:
                yield splitter.feed(piece)


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


def join(parts: list[tuple[str, str]], kind: str) -> str:
    return "".join(text for k, text in parts if k == kind)
