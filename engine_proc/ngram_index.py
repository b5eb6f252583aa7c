"""Drafts from every sequence's text: where each run of N tokens was last followed, across requests.

A sequence's own prompt is where a copy comes from, but not what a model
makes of it: a small model rewraps, skips and loops, and an answer to the
same question (a retried request, a second conversation on the same file,
the same text sent by several clients at once) is the best draft of the
next answer. So the drafter also keeps one index shared by all sequences:
each N-token window of their prompts and outputs maps to where it was
followed, the latest writer winning, as llama.cpp's ngram-mod drafter does.
A window of N = 24 tokens rarely recurs by chance, so a hit is a long copy.

Entries point into the writers' own token arrays (Drafting), which only
grow, so a draft runs on as far as the writer's text went. The index holds
at most CAPACITY windows, then starts over, keeping its memory bounded.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine_proc.drafter import Drafting

WINDOW = 24  # tokens of context a shared draft must match
CAPACITY = 1 << 20  # windows indexed before the index starts over (~150 MB at most)
_POWERS = np.array([pow(0x9E3779B97F4A7C15, i, 1 << 64) for i in range(WINDOW)], np.uint64)


class NgramIndex:
    def __init__(self):
        self._at: dict[int, tuple[Drafting, int]] = {}  # window hash -> (writer, index of the token that followed)

    def add(self, d: Drafting, start: int, end: int) -> None:
        """Index the windows of ``d``'s tokens followed by one of positions [start, end)."""
        start = max(start, WINDOW)
        if end <= start:
            return
        if len(self._at) + end - start > CAPACITY:
            self._at.clear()
        windows = np.lib.stride_tricks.sliding_window_view(d.tokens[start - WINDOW : end - 1], WINDOW)
        self._at.update(zip(_hash(windows).tolist(), zip(repeat(d), range(start, end))))

    def lookup(self, d: Drafting, k: int) -> np.ndarray | None:
        """Up to ``k`` tokens that last followed ``d``'s last WINDOW tokens in any indexed text."""
        if d.n < WINDOW:
            return None
        tail = d.tokens[d.n - WINDOW : d.n]
        hit = self._at.get(int(_hash(tail[None])[0]))
        if hit is None:
            return None
        src, at = hit
        if not np.array_equal(src.tokens[at - WINDOW : at], tail):  # a hash collision
            return None
        draft = src.tokens[at : min(at + k, src.n)]
        return draft.copy() if draft.size else None


def _hash(windows: np.ndarray) -> np.ndarray:
    """One 64-bit hash per row of WINDOW tokens (uint64 arithmetic wraps around)."""
    return (windows.astype(np.uint64) * _POWERS).sum(axis=1, dtype=np.uint64)
