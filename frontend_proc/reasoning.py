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
"""

from __future__ import annotations

from frontend_proc.generation import overlap

REASONING, CONTENT = "reasoning", "content"
# (opening, closing) markers, as the models write them.
MARKERS = (
    ("<think>", "</think>"),  # Qwen3, DeepSeek-R1, QwQ, Granite, SmolLM3 ...
    ("<seed:think>", "</seed:think>"),  # Seed-OSS
    ("[THINK]", "[/THINK]"),  # Magistral
    ("<|START_THINKING|>", "<|END_THINKING|>"),  # Command A reasoning
)
_START, _THINKING, _AFTER, _ANSWER = range(4)


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


def split(text: str, closing: str | None = None) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply."""
    splitter = ReasoningSplitter(closing)
    parts = splitter.feed(text) + splitter.flush()
    return "".join(t for kind, t in parts if kind == REASONING), "".join(t for kind, t in parts if kind == CONTENT)
