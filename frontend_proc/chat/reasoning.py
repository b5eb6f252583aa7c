"""Reasoning models: what a model writes between thinking markers, split from its answer.

Qwen3, DeepSeek-R1 and their distills (and others, with other markers) start
their reply with ``<think>...</think>``; templates that force thinking write the
opening marker into the prompt, so the reply starts inside the block. The
splitter reads the text piece by piece as the stream brings it, holds back
only what could still be the start of a marker, and once the block is closed
passes every later piece straight through: past the thinking, it costs one
comparison a piece.

Only a block at the start of the reply is reasoning, as in llama-server: a
marker the answer mentions later stays in the answer.

gpt-oss writes OpenAI's harmony format instead: messages on channels,
``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...``.
Its markers are control tokens, which detokenization drops unless told to
show them (HARMONY_TOKENS, see ChatPrompt); HarmonySplitter reads them.
"""

from __future__ import annotations

import re

from frontend_proc.core.generation import cut_at_first, overlap

REASONING, CONTENT = "reasoning", "content"
# (opening, closing) markers, as the models write them.
MARKERS = (
    ("<think>", "</think>"),  # Qwen3, DeepSeek-R1, QwQ, Granite, SmolLM3 ...
    ("<seed:think>", "</seed:think>"),  # Seed-OSS
    ("[THINK]", "[/THINK]"),  # Magistral
    ("<|START_THINKING|>", "<|END_THINKING|>"),  # Command A reasoning
)
_START, _THINKING, _AFTER, _ANSWER = range(4)
_HEADER, _BODY, _VERBATIM = range(4, 7)  # harmony: a header, a message's text, a call's text (as written)


# Harmony's markers: what the frontend must see of the reply (control tokens, written out).
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")
# What a harmony message starts with; "to=": the prompt wrote `<|start|>assistant`, the reply names a recipient.
_HARMONY_HEADS = ("<|start|>", "<|channel|>", "to=")
MESSAGE = "<|message|>"  # ends a message's header (tool_parser.HarmonyCallParser reads these too)
MESSAGE_ENDS = ("<|end|>", "<|call|>")  # <|end|> parts messages in a row; <|call|>, a call's, also ends generation
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_ANALYSIS = "<|channel|>analysis" + MESSAGE
MAX_HEADER = 256  # a header this long without <|message|> is not one


def is_harmony(template_source: str) -> bool:
    """The chat template is gpt-oss's harmony format (llama.cpp detects it the same way)."""
    return "<|channel|>" in template_source


def opened_in_prompt(prompt: str) -> str | None:
    """The closing marker, if the prompt ends inside a thinking block its template opened."""
    tail = prompt.rstrip()
    for opening, closing in MARKERS:
        if tail.endswith(opening):
            return closing
    return None


class ReasoningSplitter:
    """Splits a reply fed piece by piece into (REASONING, text) and (CONTENT, text) parts."""

    def __init__(self, closing: str | None = None):
        """closing: the prompt opened a thinking block that this marker closes (see opened_in_prompt)."""
        self._state = _THINKING if closing is not None else _START
        self._closing = closing or ""
        self._held = ""  # what could still be (the start of) a marker
        self._fresh = True  # no reasoning sent yet: its leading whitespace is dropped

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self._state == _ANSWER:
            return [(CONTENT, text)] if text else []
        parts: list[tuple[str, str]] = []
        text, self._held = self._held + text, ""
        if self._state == _START:
            head = text.lstrip()
            for opening, closing in MARKERS:
                if head.startswith(opening):
                    self._state, self._closing = _THINKING, closing
                    text = head[len(opening) :]
                    break
            else:
                if any(opening.startswith(head) for opening, _ in MARKERS):  # only whitespace, or part of a marker
                    self._held = text
                    return parts
                self._state = _ANSWER
                return [(CONTENT, text)] if text else []
        if self._state == _THINKING:
            cut = text.find(self._closing)
            if cut >= 0:
                reasoning, text = text[:cut].rstrip(), text[cut + len(self._closing) :]
                self._state = _AFTER
            else:  # hold back a possible marker start, and whitespace that may turn out to end the block
                body = text[: len(text) - overlap(text, self._closing)]
                reasoning = body.rstrip()
                self._held, text = text[len(reasoning) :], ""
            if self._fresh:
                reasoning = reasoning.lstrip()
            if reasoning:
                self._fresh = False
                parts.append((REASONING, reasoning))
        if self._state == _AFTER:  # the whitespace between the block and the answer is neither
            text = text.lstrip()
            if text:
                self._state = _ANSWER
                parts.append((CONTENT, text))
        return parts

    def flush(self) -> list[tuple[str, str]]:
        """What is held back once the reply is over: an unclosed block's end is reasoning."""
        held, self._held = self._held, ""
        if not held or (self._fresh and not held.strip()):
            return []
        return [(REASONING if self._state == _THINKING else CONTENT, held)]


class HarmonySplitter:
    """Splits a harmony reply fed piece by piece: the analysis channel is reasoning, final and commentary the answer.

    A message to a function (`` to=functions.f``, a tool call) is left in the
    answer as written, for tool_parser.HarmonyCallParser to read, when the
    request's tools are read for calls; else, as a message to a built-in tool
    (`` to=python``), it is dropped, as llama-server does. Past the final
    channel's header every piece passes straight through.
    """

    def __init__(self, in_analysis: bool = False, calls: bool = False):
        """in_analysis: the prompt ends with the analysis channel's header (see opened_in_harmony); calls: keep them."""
        self._state = _BODY if in_analysis else _HEADER
        self._kind: str | None = REASONING  # of the open message's text; None: dropped
        self._calls = calls
        self._held = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self._state == _ANSWER:
            return [(CONTENT, text)] if text else []
        text, self._held = self._held + text, ""
        parts: list[tuple[str, str]] = []
        while text:
            text = self._header(text, parts) if self._state == _HEADER else self._body(text, parts)
        return parts

    def _header(self, text: str, parts: list) -> str:
        """Read a message's header; what follows it is left to read, what cannot be one is the answer."""
        head = text.lstrip()
        cut = head.find(MESSAGE)
        if not head.startswith(_HARMONY_HEADS) or (cut < 0 and len(head) > MAX_HEADER):
            if cut < 0 and any(h.startswith(head) for h in _HARMONY_HEADS):  # only whitespace, or part of a marker
                self._held = text
                return ""
            self._state = _ANSWER
            parts.append((CONTENT, text))
            return ""
        if cut < 0:
            self._held = text
            return ""
        header, body = head[:cut], head[cut + len(MESSAGE) :]
        channel = header.rpartition("<|channel|>")[2].split(" ", 1)[0].split("<|", 1)[0]
        recipient = _RECIPIENT.search(header)
        if recipient is not None and recipient.group(1) != "assistant":  # (gpt-oss-20b's stray " to=assistant" is none)
            if self._calls and recipient.group(1).startswith("functions."):  # a call: the answer's, as written
                self._state, self._kind = _VERBATIM, CONTENT
                parts.append((CONTENT, head[: cut + len(MESSAGE)]))
            else:
                self._state, self._kind = _BODY, None
        elif channel == "final":
            self._state = _ANSWER
            if body:
                parts.append((CONTENT, body))
            return ""
        else:
            self._state, self._kind = _BODY, REASONING if channel == "analysis" else CONTENT
        return body

    def _body(self, text: str, parts: list) -> str:
        """A message's text up to its end, holding back what could be the start of one."""
        body, end, rest = cut_at_first(text, MESSAGE_ENDS)
        if end is None:
            self._held, rest = rest, ""
        elif self._state == _VERBATIM:
            body += end
        if body and self._kind is not None:
            parts.append((self._kind, body))
        if end is not None:
            self._state = _HEADER
        return rest

    def flush(self) -> list[tuple[str, str]]:
        """What is held back once the reply is over: the open message's, or the answer's."""
        held, self._held = self._held, ""
        kind = self._kind if self._state != _HEADER else CONTENT
        if not held or kind is None or (self._state == _HEADER and not held.strip()):
            return []
        return [(kind, held)]


def opened_in_harmony(prompt: str) -> bool:
    """The prompt ends inside the analysis channel: its template opened it."""
    return prompt.rstrip().endswith(_ANALYSIS)


Splitter = ReasoningSplitter | HarmonySplitter


def splitter_factory(prompt: str, harmony: bool, calls: bool = False):
    """Makes a splitter for each reply to this prompt (the prompt may have opened the thinking; calls: read for
    them)."""
    if harmony:
        in_analysis = opened_in_harmony(prompt)
        return lambda: HarmonySplitter(in_analysis, calls)
    closing = opened_in_prompt(prompt)
    return lambda: ReasoningSplitter(closing)


def split(text: str, closing: str | None = None) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply."""
    splitter = ReasoningSplitter(closing)
    parts = splitter.feed(text) + splitter.flush()
    return "".join(t for kind, t in parts if kind == REASONING), "".join(t for kind, t in parts if kind == CONTENT)
