"""Reading tool calls out of generated text as it grows, whatever the API.

`ToolCallParser.feed(text)` returns what the new text adds: plain text (str)
and `ToolCallDelta`s. A call's first delta carries its index, id and name;
then its `arguments` come as fragments of their JSON text, as OpenAI streams
them, so a route can stream both and a whole response is the same events
joined. Text that may be the start of a call (a prefix of `<tool_call>`) is
held back until it is clear either way. gpt-oss writes its calls in OpenAI's
harmony format instead, read by HarmonyCallParser (same interface).

The call object is read one character at a time by a small JSON scanner: it
only tracks strings and nesting, finds `name`, and the span of the arguments
value, which is passed on verbatim (the grammar guarantees it is valid JSON
for the tool; without a grammar, what the model wrote). A call that does not
turn out to be one (no name, no closing brace at the end) is given back as text.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from frontend_proc.chat.reasoning import MAX_HEADER, MESSAGE, MESSAGE_ENDS
from frontend_proc.chat.tools import HARMONY, ToolFormat
from frontend_proc.core.generation import cut_at_first

ARGS_KEYS = ("arguments", "parameters")


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    id: str | None = None  # the first delta of a call: id and name, no arguments yet
    name: str | None = None
    arguments: str = ""


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


def new_call_id() -> str:
    return "call_" + os.urandom(12).hex()


class _CallScanner:
    """One JSON object `{"name": ..., "arguments": ...}`, fed a character at a time."""

    def __init__(self, args_key: str):
        self.args_keys = (args_key, *ARGS_KEYS)
        self.buf = ""
        self.depth = 0
        self.in_str = self.esc = False
        self.expect_key = True
        self.key: str | None = None
        self.str_start = 0
        self.name: str | None = None
        self.args_start = self.args_end = -1
        self.done = False

    def feed(self, text: str) -> int:
        """Consume text up to the object's end; how many characters were used."""
        base = len(self.buf)
        for i, c in enumerate(text):
            p = base + i
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == '"':
                    self.in_str = False
                    if self.depth == 1:
                        self._string_end(base, text, p)
                continue
            if self.depth == 0:
                if c == "{":
                    self.depth = 1
                elif not c.isspace():
                    self.buf += text[: i + 1]
                    self.done = True  # not an object: the caller gives it back as text
                    return i + 1
                continue
            at_args = self.depth == 1 and not self.expect_key and self.key in self.args_keys
            if at_args and self.args_start < 0 and not c.isspace() and c not in ",}":
                self.args_start = p
            if c == '"':
                self.in_str = True
                self.str_start = p
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if at_args and self.args_end < 0 and self.args_start >= 0:
                    self.args_end = p  # a scalar value ends at the object's end
                elif self.depth == 1 and self.key in self.args_keys and self.args_start >= 0 and self.args_end < 0:
                    self.args_end = p + 1
                if self.depth == 0:
                    self.buf += text[: i + 1]
                    self.done = True
                    return i + 1
            elif self.depth == 1 and c == ":":
                self.expect_key = False
            elif self.depth == 1 and c == ",":
                if at_args and self.args_start >= 0 and self.args_end < 0:
                    self.args_end = p
                self.expect_key = True
        self.buf += text
        return len(text)

    def _string_end(self, base: int, text: str, p: int) -> None:
        raw = (self.buf + text[: p - base + 1])[self.str_start : p + 1]
        value = json.loads(raw)
        if self.expect_key:
            self.key = value
        elif self.key == "name":
            self.name = value
        elif self.key in self.args_keys and self.args_end < 0:
            self.args_end = p + 1

    def streamable(self) -> bool:
        """The arguments are an object or array, so their text can be passed on as it comes."""
        return self.args_start >= 0 and self.buf[self.args_start : self.args_start + 1] in ("{", "[")

    def arguments(self) -> str:
        """The arguments' JSON text once done: a string value is the JSON text itself, as some models write it."""
        if self.args_start < 0:
            return "{}"
        raw = self.buf[self.args_start : self.args_end if self.args_end >= 0 else len(self.buf)]
        return json.loads(raw.strip()) if raw.startswith('"') else raw


class ToolCallParser:
    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self.calls: list[ToolCall] = []
        self._pending = ""  # text not yet classified
        self._scanner: _CallScanner | None = None
        self._raw = ""  # the current call's text from its opener, given back if it is not a call
        self._sent_args = -1  # where the streamed arguments are up to; -1: the call is not announced
        self._call_id = ""
        self._in_calls = False  # after an opener: calls (Mistral: an array of them) follow
        self._at_start = True  # nothing but whitespace yet (Llama 3.x calls open the output)

    def feed(self, text: str) -> list[str | ToolCallDelta]:
        out: list[str | ToolCallDelta] = []
        self._pending += text
        while self._pending:
            if self._scanner is not None:
                if not self._scan(out):
                    break
            elif self._in_calls:
                if not self._between_calls(out):
                    break
            elif not self._find_opener(out):
                break
        return out

    def finish(self) -> list[str | ToolCallDelta]:
        """What is left once the output is complete: a call cut short is given back as text."""
        out: list[str | ToolCallDelta] = []
        if self._scanner is not None and self._sent_args < 0:
            out.append(self._raw + self._scanner.buf)
        elif self._scanner is not None:
            self._end_call(out)
        self._scanner = None
        if self._in_calls and self.fmt.closer.startswith(self._pending.strip()):
            self._pending = ""  # whitespace after the last call, or its closer cut short
        if self._pending:
            out.append(self._pending)
            self._pending = ""
        return out

    def _find_opener(self, out: list) -> bool:
        """In plain text: pass it on up to a call's opener; False when more text is needed."""
        fmt, text = self.fmt, self._pending
        if not fmt.opener:  # Llama 3.x: a call is a JSON object opening the output
            if self._at_start and text.lstrip().startswith("{"):
                self._start_calls("", text)
                return True
            if self._at_start and not text.strip():
                return False
            self._at_start = False
            out.append(text)
            self._pending = ""
            return False
        cut = text.find(fmt.opener)
        if cut >= 0:
            if cut:
                out.append(text[:cut])
            self._start_calls(fmt.opener, text[cut + len(fmt.opener) :])
            return True
        keep = _overlap(text, fmt.opener)
        if len(text) > keep:
            out.append(text[: len(text) - keep])
        self._pending = text[len(text) - keep :]
        return False

    def _start_calls(self, opener: str, rest: str) -> None:
        self._raw, self._pending, self._in_calls = opener, rest, True
        if not self.fmt.array:
            self._scanner = _CallScanner(self.fmt.args_key)

    def _between_calls(self, out: list) -> bool:
        """After an opener or a call: the next call, the closer, or the end of the calls."""
        text = self._pending.lstrip()
        if not text:
            return False  # whitespace between calls is dropped, before text it is kept
        fmt = self.fmt
        if fmt.array:
            if text[0] in "[,":
                self._pending = text[1:]
                self._scanner = _CallScanner(fmt.args_key)
                return True
            if text[0] == "]":
                self._pending, self._in_calls = text[1:], False
                return True
        elif fmt.opener:
            if text.startswith(fmt.closer):
                self._pending = text[len(fmt.closer) :]
                return True
            if text.startswith(fmt.opener):  # the next call of several
                self._start_calls(fmt.opener, text[len(fmt.opener) :])
                return True
            if fmt.closer.startswith(text) or fmt.opener.startswith(text):
                return False
        elif text[0] in ";{":  # Llama 3.x: further calls
            self._pending = text[1:] if text[0] == ";" else text
            self._scanner = _CallScanner(fmt.args_key)
            return True
        self._in_calls = False
        return True

    def _scan(self, out: list) -> bool:
        scanner = self._scanner
        used = scanner.feed(self._pending)
        self._pending = self._pending[used:]
        if self._sent_args < 0 and scanner.name is not None and (scanner.streamable() or scanner.done):
            self._call_id = new_call_id()
            out.append(ToolCallDelta(len(self.calls), self._call_id, scanner.name))
            self._sent_args = scanner.args_start
        if self._sent_args >= 0 and scanner.streamable():
            end = scanner.args_end if scanner.args_end >= 0 else len(scanner.buf)
            if end > self._sent_args:
                out.append(ToolCallDelta(len(self.calls), arguments=scanner.buf[self._sent_args : end]))
                self._sent_args = end
        if not scanner.done:
            return False
        if self._sent_args < 0:  # no name: not a call after all
            out.append(self._raw + scanner.buf)
            self._scanner, self._in_calls = None, False
            return True
        self._end_call(out)
        return True

    def _end_call(self, out: list) -> None:
        scanner, index = self._scanner, len(self.calls)
        if not scanner.streamable():
            out.append(ToolCallDelta(index, arguments=scanner.arguments()))
        self.calls.append(ToolCall(self._call_id, scanner.name or "", scanner.arguments()))
        self._scanner, self._sent_args = None, -1


def call_parser(fmt: ToolFormat) -> ToolCallParser | HarmonyCallParser:
    """The parser of the calls a model writes in this format."""
    return HarmonyCallParser() if fmt is HARMONY else ToolCallParser(fmt)


# What a message to a function can start with: a header, or (the prompt wrote `<|start|>assistant`) its recipient.
_HARMONY_HEADS = ("<|start|>", "<|channel|>", "to=functions.")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


class HarmonyCallParser:
    """gpt-oss's calls: a message addressed `to=functions.NAME`, whose text is the arguments.

    The recipient may be in the role's header or the channel's, as OpenAI's
    harmony format allows (llama.cpp reads both):
    `<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>` or
    `<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{...}`. Other messages
    (with --reasoning-format none, the analysis channel's) stay text, as written.
    The arguments pass on as they come; the call ends at <|call|>, <|end|> or the text's end.
    """

    def __init__(self):
        self.calls: list[ToolCall] = []
        self._pending = ""
        self._name: str | None = None  # of the call whose arguments are being read
        self._id = ""
        self._args: list[str] = []

    def feed(self, text: str) -> list[str | ToolCallDelta]:
        out: list[str | ToolCallDelta] = []
        self._pending += text
        while self._pending and (self._arguments(out) if self._name is not None else self._text(out)):
            pass
        return out

    def finish(self) -> list[str | ToolCallDelta]:
        """What is left once the output is complete: the last call's end, or text (a header cut short, unless a
        call's)."""
        out: list[str | ToolCallDelta] = []
        if self._name is not None:
            self._send(self._pending, out)
            self._end_call(out)
        elif self._pending and not (self._pending.startswith("<|") and _RECIPIENT.search(self._pending)):
            out.append(self._pending)
        self._pending = ""
        return out

    def _text(self, out: list) -> bool:
        """Pass text on up to a header; read the header once whole. False when more text is needed."""
        before, head, rest = cut_at_first(self._pending, _HARMONY_HEADS)
        if before:
            out.append(before)
        if head is None:
            self._pending = rest
            return False
        text = head + rest
        cut = text.find(MESSAGE)
        if cut < 0 and len(text) <= MAX_HEADER:
            self._pending = text
            return False
        recipient = _RECIPIENT.search(text, 0, cut) if cut >= 0 else None
        if recipient is None:  # not a call's header: text, as written
            end = cut + len(MESSAGE) if cut >= 0 else len(head)
            out.append(text[:end])
            self._pending = text[end:]
            return True
        self._name, self._id = recipient.group(1), new_call_id()
        out.append(ToolCallDelta(len(self.calls), self._id, self._name))
        self._pending = text[cut + len(MESSAGE) :]
        return True

    def _arguments(self, out: list) -> bool:
        """Pass the arguments on up to the call's end, holding back what could be the start of one."""
        arguments, end, rest = cut_at_first(self._pending, MESSAGE_ENDS)
        self._send(arguments, out)
        if end is None:
            self._pending = rest
            return False
        self._pending = rest.lstrip()
        self._end_call(out)
        return True

    def _send(self, arguments: str, out: list) -> None:
        if arguments:
            self._args.append(arguments)
            out.append(ToolCallDelta(len(self.calls), arguments=arguments))

    def _end_call(self, out: list) -> None:
        if not "".join(self._args).strip():  # a call without arguments: an empty object, as ToolCallParser gives
            self._send("{}", out)
        self.calls.append(ToolCall(self._id, self._name or "", "".join(self._args)))
        self._name, self._args = None, []


def _overlap(text: str, opener: str) -> int:
    """The length of the longest end of text that is a beginning of opener."""
    for k in range(min(len(opener) - 1, len(text)), 0, -1):
        if text.endswith(opener[:k]):
            return k
    return 0
