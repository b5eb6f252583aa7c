"""Prefix cache: the KV streams finished sequences leave behind, kept for later prompts.

Every sequence has a KV stream of its own (its slot). When it finishes, its
stream stays as it is and is an entry of the cache until the slot is
needed. A new request finds the stream that shares the longest prefix with
its prompt, an entry's or a running sequence's; the scheduler gives it that
entry's slot, or a copy of that stream, trimmed to the shared tokens, and
it prefills only the rest. A stream holds the cells of its prompt and of
the tokens generated after it, so the next turn of a chat prefills only
what is new: the end of the reply's turn and the next message.

With flash attention a token's KV cells depend on the query chunk it was
computed in: a reused cell may differ in its last bits from what a fresh
prefill of the same prompt gives, as in every server that reuses cells.
In exact mode (``unit`` = the scheduler's prefill block) only whole prompt
blocks are kept and reused: a block is always prefilled at the same
positions, in a llama_decode of its own, so its cells hold the same bits
whether computed now or for an earlier request.

Entries the streams have no room for are kept in host RAM (host_cache).
With a disk cache (disk_cache) entries also go to files, so that they
outlive the engine: those stored in host RAM as they are, those still in
their streams once the engine has been idle PERSIST_IDLE seconds (persist).
A new engine, idle before its first request, brings the newest files it
found into its empty streams (warm).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from msgspec.structs import replace

from cllm.core.protocol import PrefixCacheStats
from engine_proc.kv.disk_cache import DiskCache
from engine_proc.kv.host_cache import HostCache, Stored
from engine_proc.sequence import common_prefix, starts_with

# Tokens a host RAM entry must serve beyond what the streams do to be brought
# back. Copying it back is cheap (~1 ms for 900 tokens of the embedded model,
# about half a token's prefill), but it pushes a stream's entry out: a few
# shared tokens, a chat template's opening, are no reason to.
RESTORE_GAIN = 16
# Seconds the engine waits idle before it copies its streams' new entries out
# for the disk (4,000 cells of the embedded model are 92 MB, copied into new
# pages): a chat's next turn sent at once does not wait for that copy.
PERSIST_IDLE = 0.5
# While the disk's writer works, the idle engine looks this often whether it is done (its figures go out then).
WRITER_POLL = 0.1


# Tokens of every stream compared in one vector op: streams that share more than this with a prompt
# (few: a chat's own turns, a long system prompt) are then compared whole.
PROBE = 16


def prefix_lengths(prompt: np.ndarray, heads: np.ndarray, arrays: list[np.ndarray]) -> np.ndarray:
    """common_prefix(prompt, a) for every a in ``arrays``, whose first PROBE tokens are the rows of
    ``heads`` (padded with -1, which is no token)."""
    k = min(PROBE, len(prompt))
    if k == 0:
        return np.zeros(len(arrays), np.intp)
    differ = heads[:, :k] != prompt[:k]
    n = np.where(differ.any(axis=1), differ.argmax(axis=1), k)
    if k == PROBE:
        for i in np.flatnonzero(n == PROBE):
            n[i] = common_prefix(prompt, arrays[i])
    return n


def heads_of(arrays: list[np.ndarray]) -> np.ndarray:
    heads = np.full((len(arrays), PROBE), -1, np.int32)
    for row, tokens in zip(heads, arrays):
        head = tokens[:PROBE]
        row[: len(head)] = head
    return heads


class Held:
    """Slot -> the reusable tokens of each running sequence's stream, as the cache asks about them: which
    shares the longest prefix with a prompt, whether one holds all of an entry. Their first tokens sit in
    one array, so each question is a vector op over all of them instead of a pass per sequence."""

    def __init__(self, tokens: dict[int, np.ndarray]):
        self._slots: list[int] = list(tokens)
        self._arrays: list[np.ndarray] = list(tokens.values())
        self._heads = heads_of(self._arrays)
        self._longest = max(map(len, self._arrays), default=0)

    def add(self, slot: int, tokens: np.ndarray) -> None:
        """A sequence admitted into ``slot`` (a free one: no running sequence's)."""
        self._slots.append(slot)
        self._arrays.append(tokens)
        self._heads = np.concatenate((self._heads, heads_of([tokens])))
        self._longest = max(self._longest, len(tokens))

    def prefixes(self, prompt: np.ndarray) -> list[tuple[int, np.ndarray, int]]:
        """(slot, tokens, shared prefix) of every running sequence."""
        return list(zip(self._slots, self._arrays, prefix_lengths(prompt, self._heads, self._arrays).tolist()))

    def holding(self, prefixes: list[np.ndarray]) -> list[bool]:
        """For each of ``prefixes``, whether a running sequence's tokens begin with all of it: the first PROBE
        tokens of all of them against all of the running ones' in one vector op (an entry to place asks this
        of every free slot's entry), the rest compared only where those agree."""
        out = [False] * len(prefixes)
        ask = [i for i, p in enumerate(prefixes) if len(p) <= self._longest]  # often few: entries outlast what runs
        if not ask or not self._arrays:
            return out
        heads = heads_of([prefixes[i] for i in ask])
        within = np.arange(PROBE) < np.array([len(prefixes[i]) for i in ask])[:, None]
        agree = ((heads[:, None, :] == self._heads[None, :, :]) | ~within[:, None, :]).all(axis=2)
        for q, r in zip(*np.nonzero(agree)):
            i = ask[q]
            out[i] = out[i] or starts_with(self._arrays[r], prefixes[i])
        return out


@dataclass(slots=True)
class Entry:
    tokens: np.ndarray  # the tokens whose KV cells the stream holds, position by position
    last_used: int
    persisted: bool = False  # handed to the disk cache, or passed over
    warmed: bool = False  # brought from a file while the engine was idle, and not reused since
    # The logits after tokens[:upto], the prompt of the sequence that left it, computed with its cells: that
    # prompt asked again reuses all of them and picks its first token from these (see lookup).
    logits: np.ndarray | None = None
    upto: int = 0


class PrefixCache:
    def __init__(self, unit: int, host_bytes: int = 0, disk: DiskCache | None = None):
        self.unit = unit  # a reused prefix is a multiple of it
        self.entries: dict[int, Entry] = {}  # slot -> what its stream holds
        self.host = HostCache(host_bytes, disk) if host_bytes or disk is not None else None
        self.disk = disk
        self._stats = PrefixCacheStats()
        self._clock = 0
        self._kept_at = 0.0  # when the last entry was kept (time.monotonic)
        self._disk_seen = (0, 0)  # the disk's (entries, bytes) when persist last looked

    def stats(self) -> PrefixCacheStats:
        stats = replace(self._stats, cells=sum(len(e.tokens) for e in self.entries.values()))
        if self.host is not None:
            stats.host_cells, stats.host_bytes = self.host.cells(), self.host.bytes
        if self.disk is not None:
            stats.disk_entries, stats.disk_bytes = self.disk.stats()
            stats.disk_hits, stats.disk_load_seconds = self.disk.hits, self.disk.load_seconds
            stats.disk_rejected = self.disk.rejected
        return stats

    def keep(self, slot: int, tokens: np.ndarray, logits: np.ndarray | None = None, upto: int = 0) -> None:
        self._clock += 1
        self.entries[slot] = Entry(tokens, self._clock, logits=logits, upto=upto)
        self._kept_at = time.monotonic()

    def persist_wait(self) -> float | None:
        """Seconds until persist or warm has something to do while the engine stays idle; None: nothing."""
        if self.disk is None:
            return None
        if self.disk.found:
            return 0.0
        if any(not e.persisted and self.disk.wants(e.tokens) for e in self.entries.values()):
            return max(0.0, self._kept_at + PERSIST_IDLE - time.monotonic())
        return WRITER_POLL if self.disk.writing() else None

    def persist(self, kv, now: bool = False) -> bool:
        """Hand the disk cache the streams' entries it has no file of, once the engine has been idle
        PERSIST_IDLE seconds (``now``: at once); whether the disk's figures changed since the last call.

        ``kv`` (the model runner) copies a settled stream's cells to host bytes.
        """
        if self.disk is None:
            return False
        if now or time.monotonic() >= self._kept_at + PERSIST_IDLE:
            for slot, entry in self.entries.items():
                if not entry.persisted and self.disk.wants(entry.tokens) and kv.settled(slot):
                    self.disk.put(entry.tokens, kv.save(slot))
                entry.persisted = True
        seen, self._disk_seen = self._disk_seen, self.disk.stats()
        return seen != self._disk_seen

    def warm(self, kv, empty: list[int]) -> bool:
        """Bring the newest file found at the start that no entry holds into the highest of the ``empty``
        free streams (new sequences take the lowest); whether a file was taken up (or passed over).

        Called while the engine is idle, one file a call, until its first step (``empty`` is then []): a
        request that comes waits for one copy at most. The files left stay on disk and serve lookups from there.
        """
        if self.disk is None or not self.disk.found:
            return False
        if not empty:
            self.disk.found.clear()
            return False
        on_disk = self.disk.newest_found()
        if on_disk is None or any(starts_with(e.tokens, on_disk.tokens) for e in self.entries.values()):
            return on_disk is not None
        data = self.disk.load(on_disk, use=False)
        if data is None:
            return True
        slot = max(empty)
        if not kv.restore(slot, data):
            kv.clear(slot)
            return True
        self.disk.warmed()
        # recency 0: worth less than every entry this engine used, so these streams are the first to go
        self.entries[slot] = Entry(on_disk.tokens, 0, persisted=True, warmed=True)
        return True

    def close(self, kv) -> None:
        """The engine stops: its streams' entries go to disk, and the writer finishes (for a few seconds at most)."""
        if self.disk is not None:
            self.persist(kv, now=True)
            self.disk.close()

    def lookup(
        self, prompt: np.ndarray, running: Held, host: bool = True, into: int = -1, whole: bool = False
    ) -> tuple[int, int, Stored | None]:
        """(slot, tokens, None) of the longest reusable prefix of ``prompt`` among the
        entries and the running sequences' reusable tokens;
        (-1, tokens, stored) if an entry in host RAM (when ``host``) has a longer one;
        (-1, 0, None) if there is none. Ties go to an entry, which can be used in place:
        the one in ``into``, the slot the prompt's sequence will take (nothing to copy
        into it), else the shortest one (the fewest cells to move out of the way).

        The prompt's last token is left to prefill: its logits pick the first
        new token. But with ``whole`` (its sequence can pick that token from
        kept logits, Sampler.keeps), an entry left by the same prompt serves
        all of it with the logits its prefill gave (Entry.logits). Decoding
        the last token again in a step of one row would give its cells other
        last bits than the prompt's chunk did, and at a near tie a greedy
        answer asked again then parts from the first one, as the embedded
        model's copy tasks did in 10 of 12 prompts without speculation
        (perf/results/2026-12-03-repeated-prompt-kept-logits.md); and a
        repeated prompt's first token now waits for no decode.
        """
        longest = len(prompt) - 1
        entries = list(self.entries.items())
        arrays = [e.tokens for _, e in entries]
        shared = prefix_lengths(prompt, heads_of(arrays), arrays).tolist() if entries else []
        candidates = [(slot, e.tokens, True, n) for (slot, e), n in zip(entries, shared)]
        candidates += [(slot, tokens, False, n) for slot, tokens, n in running.prefixes(prompt)]
        src, best = -1, (0, False, False, 0)
        for slot, tokens, is_entry, shared_n in candidates:
            n = min(shared_n, longest) // self.unit * self.unit
            if whole and is_entry and shared_n > longest and self.entries[slot].upto == len(prompt):
                n = len(prompt)
            rank = (n, is_entry, slot == into, -len(tokens))
            if n and rank > best:
                src, best = slot, rank
        reuse = best[0]
        while host and self.host is not None:
            stored, n = self.host.lookup(prompt, longest, self.unit, whole)
            if n < reuse + RESTORE_GAIN:
                break
            if self.host.load(stored):
                return -1, n, stored
            # a file that is gone or was dropped (its cells did not check): looked up again without it
        entry = self.entries.get(src)
        if entry is not None and reuse * 2 >= len(entry.tokens):  # a few shared words are no use of it
            self._clock += 1
            entry.last_used = self._clock
        return src, reuse, None

    def count(self, reuse: int, stored: Stored | None, src: int) -> None:
        """Count an admission that reused ``reuse`` cached tokens, ``stored`` in host RAM or a file, or in
        stream ``src`` (stored None). An entry warmed from a file counts as served from disk at its first reuse."""
        if reuse == 0:
            self._stats.misses += 1
            return
        self._stats.hits += 1
        self._stats.hit_tokens += reuse
        entry = self.entries.get(src) if stored is None else None
        if stored is not None and stored.disk is not None:
            self.disk.served()
        elif stored is not None:
            self._stats.restored += 1
        elif entry is not None and entry.warmed:
            entry.warmed = False
            self.disk.served(loaded_now=False)

    def rehome(self, entry: Entry, free_slots: list[int], running: Held) -> tuple[int, Entry | None]:
        """A free slot for ``entry``, whose own slot a running sequence takes (-1: none), and the entry
        that loses its stream: the one that was in that slot, or ``entry`` itself.

        - An entry whose cells another entry holds too is let go without loss (a
          prompt asked again, greedy, leaves the same tokens behind): (-1, None).
        - Else it goes to the free slot worth least (see victim), if that is worth
          less than itself,
        - unless host RAM would keep either and the entry in that slot is at least
          twice as long: then the entry itself goes to host RAM. Both are kept either
          way, and the copy out costs by the byte, new host pages more (a 5.2 MB
          entry: 1.7 ms here, into pages faulted in at once: ModelRunner.save).
        """
        if any(starts_with(e.tokens, entry.tokens) for e in self.entries.values()):
            return -1, None
        dst = self.victim(free_slots, running)
        there = self.entries.get(dst)
        worth_there, worth = self._worths([there, entry], running)
        if dst < 0 or worth_there >= worth:
            return -1, entry
        if worth_there >= 0 and len(there.tokens) >= 2 * len(entry.tokens) and self.worth_keeping(entry, running):
            return -1, entry
        self.entries[dst] = entry
        return dst, there

    def worth_keeping(self, entry: Entry, running: Held) -> bool:
        """Whether an entry losing its stream has cells no running sequence holds and host RAM would keep.
        A warmed entry no prompt has reused is not: its file still serves it, and a copy into new host
        pages would be paid by the request that displaced it."""
        if entry.warmed or self._worths([entry], running)[0] < 0:
            return False
        return self.host is not None and self.host.wants(entry.tokens)

    def victim(self, free_slots: list[int], running: Held) -> int:
        """The free slot whose loss costs the cache least, the lowest of equals; -1 if there is none.

        An empty slot costs nothing; an entry whose cells a running sequence
        holds too costs next to nothing (that sequence will leave them
        behind); the others cost their recency.
        """
        worths = self._worths([self.entries.get(s) for s in free_slots], running)
        return min(zip(worths, free_slots), default=(0, -1))[1]

    @staticmethod
    def _worths(entries: list[Entry | None], running: Held) -> list[int]:
        """Each entry's worth: -2 for no entry, -1 for one whose cells a running sequence holds too, else its
        recency."""
        some = [e for e in entries if e is not None]
        held = iter(running.holding([e.tokens for e in some]))
        return [-2 if e is None else -1 if next(held) else e.last_used for e in entries]
