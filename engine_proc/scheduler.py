"""Iteration-level scheduling: every step admits, decodes and retires.

A step's batch holds one token for every decoding sequence, then prompt
chunks (of running sequences still prefilling, then of newly admitted ones)
up to the token budget. Sequences leave the moment they finish, and their
KV slot goes to the next waiting request in the same step.

Running sequences always sit in slots 0..n-1 and the batch lists them in
slot order: llama.cpp decodes a run of consecutive seq_ids in one graph, and
a gap would split the step in two. New requests take the lowest free slots;
a gap they do not fill is closed by moving the top sequence down into it.
"""

from __future__ import annotations

import heapq
from collections import deque

from engine_proc.sequence import Chunk, Sequence


class Scheduler:
    def __init__(self, parallel: int, token_budget: int, seq_ctx: int):
        self.token_budget = token_budget
        self.seq_ctx = seq_ctx
        self.free_slots = list(range(parallel))  # a heap: the lowest slot first
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, ids: set[int]) -> list[Sequence]:
        """Take the given sequences out, waiting or running; their slots are free."""
        gone = [s for s in self.waiting if s.id in ids]
        if gone:
            self.waiting = deque(s for s in self.waiting if s.id not in ids)
        running = [s for s in self.running if s.id in ids]
        if running:
            self.running = [s for s in self.running if s.id not in ids]
            for seq in running:
                heapq.heappush(self.free_slots, seq.slot)
        return gone + running

    def schedule(self) -> tuple[list[Chunk], list[tuple[int, int]]]:
        """This step's chunks in slot order, and the (from, to) slot moves to make first."""
        budget = self.token_budget
        chunks = []
        for seq in self.running:
            if not seq.prefilling and budget > 0:
                chunks.append(Chunk(seq, seq.n_cached, seq.n_cached + 1))
                budget -= 1
        for seq in self.running:
            if seq.prefilling and budget > 0:
                budget -= self._prefill(seq, budget, chunks)
        while self.waiting and self.free_slots and budget > 0:
            seq = self.waiting.popleft()
            seq.slot = heapq.heappop(self.free_slots)
            self.running.append(seq)
            budget -= self._prefill(seq, budget, chunks)
        moves = self._compact()
        chunks.sort(key=lambda c: c.seq.slot)
        return chunks, moves

    def _compact(self) -> list[tuple[int, int]]:
        n = len(self.running)
        moves = []
        if not self.free_slots or self.free_slots[0] >= n:
            return moves  # no gap below the top slot
        for seq in sorted(self.running, key=lambda s: s.slot, reverse=True):
            if seq.slot < n:
                break
            hole = heapq.heappushpop(self.free_slots, seq.slot)
            moves.append((seq.slot, hole))
            seq.slot = hole
        return moves

    @staticmethod
    def _prefill(seq: Sequence, budget: int, chunks: list[Chunk]) -> int:
        n = min(budget, len(seq.prompt) - seq.n_cached)
        chunks.append(Chunk(seq, seq.n_cached, seq.n_cached + n))
        return n

    def finish_reason(self, seq: Sequence, token: int, is_eog: bool) -> str | None:
        """Record the sampled token; say why the sequence ends, if it does."""
        if is_eog and not seq.params.ignore_eos:
            return "stop"
        seq.output.append(token)
        if len(seq.output) >= seq.params.max_tokens or seq.n_cached >= self.seq_ctx:
            return "length"
        return None
