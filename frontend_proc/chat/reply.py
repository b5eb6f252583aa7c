"""A reply read as it grows, the same for every chat door: thinking apart, then tool calls out of the answer.

Reply turns the text pieces of one choice into parts: (REASONING, text),
(CONTENT, text) and (CALL, ToolCallDelta) (frontend_proc.chat.reasoning splits the
thinking off, frontend_proc.chat.tool_parser reads the calls), which each door
writes out in its own shapes. Blocks is the open/close state machine of the
doors whose replies are a list of typed blocks (Anthropic's content blocks,
the Responses API's output items): a new block at each change of kind and at
each new call.
"""

from __future__ import annotations

from frontend_proc.chat.reasoning import CONTENT, REASONING, Splitter
from frontend_proc.chat.tool_parser import ToolCall, ToolCallDelta, call_parser
from frontend_proc.chat.tools import ToolPlan

CALL = "call"  # a part that is a ToolCallDelta

__all__ = ["CALL", "CONTENT", "REASONING", "Blocks", "Reply", "join"]


class Reply:
    """One reply read piece by piece: thinking apart, then tool calls out of the answer."""

    def __init__(self, splitter: Splitter | None, tool_plan: ToolPlan | None):
        self._splitter = splitter
        self._parser = call_parser(tool_plan.format) if tool_plan is not None and tool_plan.parse else None

    @property
    def calls(self) -> list[ToolCall]:
        return self._parser.calls if self._parser is not None else []

    def finish(self, finish: str | None) -> str | None:
        """Why the choice ended: "tool_calls" when it stopped after calling tools, else the engine's reason."""
        return "tool_calls" if finish == "stop" and self._parser is not None and self._parser.calls else finish

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


def join(parts: list[tuple], kind: str) -> str:
    return "".join(text for k, text in parts if k == kind)


class Blocks:
    """The blocks of a streamed reply: which one is open, when it closes, when the next opens.

    A door says what opening, filling and closing a block writes (open,
    delta, close); feed() and end() call them in the right order.
    """

    def __init__(self):
        self.kind: str | None = None  # of the open block

    def open(self, kind: str, call: ToolCallDelta | None) -> list[bytes]:
        raise NotImplementedError

    def delta(self, kind: str, text: str) -> list[bytes]:
        raise NotImplementedError

    def close(self) -> list[bytes]:
        raise NotImplementedError

    def feed(self, parts: list[tuple]) -> list[bytes]:
        out: list[bytes] = []
        for kind, part in parts:
            if kind != self.kind or (kind == CALL and part.id is not None):
                if self.kind is not None:
                    out += self.close()
                self.kind = kind
                out += self.open(kind, part if kind == CALL else None)
            if kind != CALL:
                out += self.delta(kind, part)
            elif part.arguments:
                out += self.delta(kind, part.arguments)
        return out

    def end(self) -> list[bytes]:
        """Close the open block, if any."""
        return self.close() if self.kind is not None else []
