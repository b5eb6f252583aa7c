"""The KV streams' books: which stream (slot) each sequence takes, and the cells that move with it.

Every sequence has a KV stream of its own; the streams no sequence holds
keep the prefix cache's entries (prefix_cache). A new sequence takes a free
slot next to the running ones, with the longest cached prefix of its prompt
copied into it or taken over in place (an entry from host RAM or a file
restored first), what the slot held moved out of the way or let go; a
finished one leaves its cells behind as an entry. The scheduler
(engine_proc/scheduler.py) decides when; this keeps the books of where.

Cells move through ``kv`` (the model runner): between streams in host
memory at once; between streams in device memory at the start of the next
llama_decode, in the order asked; saves and restores through host RAM at once.
"""

from __future__ import annotations

import heapq
from typing import Protocol

import numpy as np

from engine_proc.kv.host_cache import Stored
from engine_proc.kv.prefix_cache import Entry, Held, PrefixCache
from engine_proc.sequence import Sequence


class KvStreams(Protocol):
    moves_at_once: bool  # streams in host memory: copies and swaps happen at once, so every stream is settled

    # dst := the cells of src before position `keep` (a Sequence's cell n is at its position(n))
    def copy(self, src: int, dst: int, keep: int) -> None: ...
    def swap(self, a: int, b: int) -> None: ...  # trade the two streams' cells
    def trim(self, slot: int, keep: int) -> None: ...  # drop the cells from position `keep` on
    def clear(self, slot: int) -> None: ...
    # Host RAM copies, at once rather than at the next decode: only of a stream
    # no copy or swap asked this step reads or writes (a settled one).
    def settled(self, slot: int) -> bool: ...
    def save(self, slot: int) -> np.ndarray: ...
    def restore(self, slot: int, data: np.ndarray) -> bool: ...


class Slots:
    def __init__(self, n: int, kv: KvStreams, cache: PrefixCache | None, exact: bool, block: int):
        self.kv = kv
        self.cache = cache
        self.exact = exact  # reuse only whole prompt blocks of ``block`` tokens (see Scheduler)
        self.block = block
        self.free = list(range(n))  # a heap: the lowest slot first
        self._held: Held | None = None  # this step's, built at its first admission

    def new_step(self) -> None:
        self._held = None

    def reusable(self, seq: Sequence) -> int:
        """How many of the sequence's first tokens have KV cells a later prompt may reuse.

        All that are filled, generated tokens included; in exact mode only
        the prompt's complete blocks, the cells computed as a prefill computes them.
        """
        if self.exact:  # a scored prompt's chunks are not blocks
            return 0 if seq.scored else min(seq.n_cached, len(seq.prompt)) // self.block * self.block
        return seq.n_cached

    def _held_now(self, running: list[Sequence]) -> Held:
        """Slot -> the reusable tokens each running sequence's stream holds: built once a step, kept as
        sequences are admitted (nothing else changes a running one's slot or tokens within a step: see new_step)."""
        if self._held is None:
            self._held = Held({s.slot: s.key(self.reusable(s)) for s in running})
        return self._held

    def admit(self, seq: Sequence, running: list[Sequence]) -> bool:
        """A slot for the new sequence, and its cached prefix (seq.n_cached); whether it continues a cache entry."""
        if self.cache is None:
            seq.slot = self._take(self._next_slot(running))
            return False
        seq.n_cached, continues = self._reuse_prefix(seq, running)
        seq.reused = seq.n_cached
        if self._held is not None:
            self._held.add(seq.slot, seq.key(self.reusable(seq)))
        return continues

    def release(self, seq: Sequence) -> None:
        """A running sequence leaves: its slot is free, its reusable cells stay in its stream as a cache entry."""
        heapq.heappush(self.free, seq.slot)
        keep = seq.image_edge(self.reusable(seq))  # not half an image
        if self.cache is not None and keep:
            self.kv.trim(seq.slot, seq.position(keep))
            whole = keep >= len(seq.prompt) and seq.end_logits is not None
            self.cache.keep(seq.slot, seq.key(keep), *((seq.end_logits, len(seq.prompt)) if whole else ()))
        else:
            self.kv.clear(seq.slot)

    def warm(self, steps: int) -> bool:
        """Idle before the first step, streams in device memory: a file the disk cache found at the start
        goes into an empty stream (PrefixCache.warm). Once requests have run, the files left serve lookups
        from disk; with streams in host memory they always do, as _fetch restores a file straight into the
        stream its sequence takes, where a warmed stream would trade places with it: a save and a restore
        of each, through scratch pages a new process has yet to touch, cost that turn what the warming saved."""
        cache = self.cache
        if steps or self.kv.moves_at_once:
            return cache.warm(self.kv, [])
        return cache.warm(self.kv, [s for s in self.free if s not in cache.entries and self.kv.settled(s)])

    def _reuse_prefix(self, seq: Sequence, running: list[Sequence]) -> tuple[int, bool]:
        """Give the new sequence the lowest free slot and the longest cached prefix of its prompt.

        Returns the prefix's length, and whether the sequence took over the entry it continues.

        An entry the prompt extends (a chat's previous turn), or nearly (its
        cells past the shared prefix are at most an eighth of it), becomes
        the sequence's: it trades slots with whatever the slot it takes
        holds (_next_slot), so no entry is lost. Otherwise the sequence gets a copy of the
        shared prefix, and an entry that shares only its start with the
        prompt (a system prompt, say) keeps the rest for its own conversation.
        An entry in host RAM that serves the prompt better than any stream is
        first brought back into a free stream (see _fetch).
        """
        cache = self.cache
        held = self._held_now(running)
        prompt = seq.key(1 if seq.scored else len(seq.prompt))  # a scored prompt needs every token's logits
        into = self._next_slot(running)  # the slot the sequence takes: _fetch leaves the free slots as they are
        whole = seq.keeps_logits  # the whole prompt, if an entry kept the logits after it (PrefixCache.lookup)
        src, reuse, stored = cache.lookup(prompt, held, into=into, whole=whole)
        if stored is not None:
            src = self._fetch(stored, held, into)
            if src < 0:  # no stream can take it this step: the best a stream holds, then
                src, reuse, stored = cache.lookup(prompt, held, host=False, into=into, whole=whole)
        reuse = seq.image_edge(reuse)
        cache.count(reuse, stored, src)
        slot = seq.slot = self._take(into)
        entry = cache.entries.get(src)
        if entry is not None and reuse == len(seq.prompt):
            seq.end_logits = entry.logits
        if entry is not None and (len(entry.tokens) - reuse) * 8 <= reuse:
            if src != slot:
                self._swap(src, slot)
            del cache.entries[slot]
            self.kv.trim(slot, seq.position(reuse))
            return reuse, True
        resident = cache.entries.pop(slot, None)
        if resident is not None:  # it has cells the new sequence will not keep
            self._rehome(slot, resident, held, exclude=src)
        if src == slot:
            self.kv.trim(slot, seq.position(reuse))
        elif src >= 0:
            self.kv.copy(src, slot, seq.position(reuse))
        else:
            self.kv.clear(slot)
        return reuse, False

    def _swap(self, a: int, b: int) -> None:
        """Trade two streams' cells, and their cache entries."""
        self.kv.swap(a, b)
        ea, eb = self.cache.entries.pop(a, None), self.cache.entries.pop(b, None)
        if ea is not None:
            self.cache.entries[b] = ea
        if eb is not None:
            self.cache.entries[a] = eb

    def _rehome(self, slot: int, entry: Entry, held: Held, exclude: int) -> None:
        """Move the entry out of ``slot`` before it is overwritten, or let it go (to host RAM if it has room)."""
        dst, lost = self.cache.rehome(entry, [s for s in self.free if s != exclude], held)
        if lost is not None:
            self._stash(slot if dst < 0 else dst, lost, held)
        if dst >= 0:
            self.kv.copy(slot, dst, len(entry.tokens))

    def _stash(self, slot: int, entry: Entry, held: Held) -> None:
        """Copy the cells of an entry about to lose its stream to host RAM, if they are worth it."""
        if self.cache.worth_keeping(entry, held) and self.kv.settled(slot):
            self.cache.host.put(entry.tokens, self.kv.save(slot), entry.logits, entry.upto)

    def _fetch(self, stored: Stored, held: Held, into: int) -> int:
        """Bring an entry back from host RAM or a file into a free stream; that stream, -1 if none can take it now.

        Into ``into``, the slot the new sequence takes, when the free streams' cells can move at once (what
        it holds moves out of the way first): the sequence then uses the cells where they land. Anywhere
        else, they would then trade places with that slot's, a save and a restore of each (on a quiet
        16-core CPU a 4,000-token conversation's next turn after a restart went from 0.17-0.21 s to
        0.16-0.17 s). Else into the settled free slot worth least.
        """
        cache = self.cache
        here = self.kv.moves_at_once
        dst = into if here else cache.victim([s for s in self.free if self.kv.settled(s)], held)
        if dst < 0:
            return -1
        cache.host.take(stored)  # first: room for what it displaces
        lost = cache.entries.pop(dst, None)
        if lost is not None and here:
            self._rehome(dst, lost, held, exclude=dst)
        elif lost is not None:
            self._stash(dst, lost, held)
        if not self.kv.restore(dst, stored.data):
            self.kv.clear(dst)
            return -1
        cache.keep(dst, stored.tokens, stored.logits, stored.upto)
        return dst

    def _next_slot(self, running: list[Sequence]) -> int:
        """The free slot a new sequence takes: the lowest in a gap between the running sequences' slots, else
        the one just below them, else just above (the lowest when none runs), so that they stay one run of
        consecutive slots (see _compact)."""
        if not running:
            return self.free[0]
        slots = [s.slot for s in running]
        lo, hi = min(slots), max(slots)
        return min((s for s in self.free if lo < s < hi), default=lo - 1 if lo else hi + 1)

    def _take(self, slot: int) -> int:
        """Take ``slot`` out of the free slots; it."""
        self.free.remove(slot)
        heapq.heapify(self.free)
        return slot

    def compact(self, running: list[Sequence]) -> bool:
        """Close the gaps between the decoding sequences' slots: those outside the run of len(running) slots
        that holds most of them (the lowest of equals) move into its free slots.

        llama.cpp decodes a run of consecutive seq_ids in one graph, and a
        gap would split the step in two; where the run starts does not
        matter, so sequences that are one run already stay where they are (a
        move copies a stream's cells twice through host memory, more with an
        entry in the way). A cache entry in the way trades places with the
        sequence. Whether any moved.
        """
        n = len(running)
        if not self.free or not n:
            return False
        taken = sorted(s.slot for s in running)
        if taken[-1] - taken[0] < n:
            return False  # one run already
        inside = [0] * (n + len(self.free) + 1)  # inside[w]: running slots below w
        for slot in taken:
            inside[slot + 1] += 1
        for w in range(1, len(inside)):
            inside[w] += inside[w - 1]
        start = max(range(len(inside) - n), key=lambda w: (inside[w + n] - inside[w], -w))
        holes = [s for s in self.free if start <= s < start + n]
        heapq.heapify(holes)
        moved = False
        for seq in sorted(running, key=lambda s: s.slot, reverse=True):
            if start <= seq.slot < start + n or seq.prefilling:  # a prefilling one moves once it decodes
                continue
            hole = heapq.heappop(holes)
            self._take(hole)
            heapq.heappush(self.free, seq.slot)
            if self.cache is not None and hole in self.cache.entries:
                self._swap(hole, seq.slot)
            else:
                self.kv.copy(seq.slot, hole, seq.position(seq.n_cached))
                self.kv.clear(seq.slot)
            seq.slot = hole
            moved = True
        return moved
