"""Drafts by a draft model (--model-draft, `--spec-type draft-simple`): a smaller model of the same vocabulary
guesses each decoding sequence's next tokens greedily, and the step's batch verifies them as it verifies prompt
lookup's (engine_proc/step/recorder.py), so the text is the target's whatever the draft.

Every sequence asking for a draft in a step gets it from the same llama_decode calls: the first holds each one's
tokens the draft context has not seen yet (a new prompt, the tokens kept since its last draft) and its last known
token, whose logits give every draft's first token; each further call decodes every still-drafting sequence's
last drafted token, one row each, for the next. A sequence's cells in the draft context (one stream each, by
engine_proc/run/draft_runner.py) are kept as the tokens they were computed from: at its next draft they are cut
(llama_memory_seq_rm) where they part from its known tokens, a rejected draft's included, and only the rest is
computed. A stream a sequence left keeps its cells for the next one whose text starts the same (a repeated
prompt), but for a seeded sampled request, whose cells are computed anew so that its drafts, and so its batches,
repeat run after run. The prefix cache, restarts and images touch none of this: a prefix the target's cache
served is computed here once, and sequences with images draft nothing.
"""

from __future__ import annotations

import numpy as np

from engine_proc.run.draft_runner import DraftRunner
from engine_proc.sequence import Sequence, common_prefix

TOP_K = 10  # llama-server's draft sampler keeps the 10 likeliest: p_min is a probability among them


class DraftModel:
    def __init__(self, runner: DraftRunner, n_max: int, n_min: int, p_min: float):
        self.runner = runner
        self.n_max, self.n_min, self.p_min = n_max, n_min, p_min
        self.held = [np.empty(0, np.int32) for _ in range(runner.streams)]  # the tokens each stream's cells hold
        self.free = list(range(runner.streams))
        self.stream: dict[int, int] = {}  # sequence id -> its stream

    def drafts(self, asks: list[tuple[Sequence, int]]) -> list[np.ndarray | None]:
        """Each sequence's draft of at most its room of tokens (None: none, or its cells are still being caught
        up: a step's first call holds at most a batch of rows)."""
        r, n = self.runner, 0
        going: list[tuple[int, int]] = []  # (index in asks, its stream) of those whose drafts start this step
        for i, (seq, _) in enumerate(asks):
            s = self._stream(seq)
            if s is None:
                continue
            known = seq.known(len(seq.prompt) + len(seq.output))
            keep = common_prefix(self.held[s], known[:-1])
            if keep < len(self.held[s]):
                r.trim(s, keep)
            todo = known[keep:]  # its last known token ends them: its logits start the draft
            take = min(len(todo), r.size - n - (len(asks) - i - 1))  # room for the others' last tokens
            if take <= 0:
                self.held[s] = known[:keep].copy()
                continue
            n = self._rows(s, todo[:take], keep, n, logits=take == len(todo))
            self.held[s] = known[: keep + take].copy()
            if take == len(todo):
                going.append((i, s))
        out: list[np.ndarray | None] = [None] * len(asks)
        if not going:
            if n:
                r.decode(n, 0)
            return out
        got: list[list[int]] = [[] for _ in going]
        logits = r.decode(n, len(going))
        while going:
            tokens, stop = self._next(logits)
            n, still, kept = 0, [], []
            for (i, s), toks, token, low in zip(going, got, tokens, stop):
                if low or token >= r.target_vocab:
                    continue
                toks.append(token)
                if len(toks) < asks[i][1]:
                    n = self._rows(s, np.array([token], np.int32), len(self.held[s]), n, logits=True)
                    self.held[s] = np.append(self.held[s], np.int32(token))
                    still.append((i, s))
                    kept.append(toks)
            for (i, _), toks in zip(going, got):
                if len(toks) >= max(self.n_min, 1):
                    out[i] = np.array(toks, np.int32)
            going, got = still, kept
            if going:
                logits = r.decode(n, len(going))
        return out

    def _stream(self, seq: Sequence) -> int | None:
        """The sequence's stream; at its first draft, the free one whose cells share most of its text."""
        s = self.stream.get(seq.id)
        if s is not None or not self.free:
            return s
        p = seq.params
        if p.temperature > 0 and p.seed is not None:
            s = self.free.pop()
            self.runner.trim(s, 0)
            self.held[s] = self.held[s][:0]
        else:
            known = seq.known(len(seq.prompt))
            s = max(self.free, key=lambda f: common_prefix(self.held[f], known))
            self.free.remove(s)
        self.stream[seq.id] = s
        return s

    def _rows(self, s: int, tokens: np.ndarray, pos: int, n: int, logits: bool) -> int:
        """Tokens of stream ``s`` from position ``pos`` written at row ``n`` of the batch, the last one's logits
        asked if ``logits``; the rows written so far."""
        b, k = self.runner.batch, len(tokens)
        b.token[n : n + k] = tokens
        b.pos[n : n + k] = np.arange(pos, pos + k, dtype=np.int32)
        b.seq_id[n : n + k] = s
        b.logits[n : n + k] = 0
        b.logits[n + k - 1] = logits
        return n + k

    def _next(self, logits: np.ndarray) -> tuple[list[int], list[bool]]:
        """Each row's likeliest token, and whether its probability among the TOP_K likeliest is under p_min."""
        tokens = logits.argmax(axis=1)
        if self.p_min <= 0:
            return tokens.tolist(), [False] * len(tokens)
        top = np.partition(logits, -TOP_K, axis=1)[:, -TOP_K:]
        best = logits[np.arange(len(tokens)), tokens][:, None]
        p = 1.0 / np.exp(top - best).sum(axis=1)
        return tokens.tolist(), (p < self.p_min).tolist()

    def leave(self, seq: Sequence) -> None:
        """The sequence is gone: its stream is free, its cells kept for a text that starts as its did."""
        s = self.stream.pop(seq.id, None)
        if s is not None:
            self.free.append(s)
