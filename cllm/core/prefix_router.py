"""Which replica of a model gets a request: the one that likely caches its prompt's start, unless busy.

Each replica's engine keeps the KV cells of what it ran (prompts and the tokens
generated after them) and reuses any prefix of them. The router does not ask
the engines what they hold: it remembers what it sent each replica. That is
known at once (an engine's EngineStats come at most once a second, too late
for the next turn of a chat), costs the engines nothing, and does not depend
on how their cache is built. What it remembers is a bounded LRU of hashes of
block-aligned prefixes, so a lookup hashes the prompt once per BLOCK tokens
and does one dict lookup per block and replica. It may believe a replica holds
what that replica has since evicted; then the request is merely prefilled.

The rule: the replica with the longest remembered prefix, unless it has more
than ``slack`` requests more in flight than the least loaded one; then (or
when no replica remembers anything) the least loaded, ties going round robin
so that unrelated requests spread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

BLOCK = 32  # tokens per hashed block: prefixes shorter than this are not worth steering for
K = TypeVar("K", bound=Hashable)


def pick(lengths: Mapping[K, int], loads: Mapping[K, int], slack: int, idle: Sequence[K]) -> K:
    """The rule: the replica with the longest cached prefix (the less loaded of equals), unless it has
    more than ``slack`` requests in flight beyond the least loaded; else ``idle[0]``, a least loaded one.

    lengths and loads: per candidate replica; idle: the least loaded ones, in the order to take them.
    """
    best, best_len = idle[0], 0
    for replica, length in lengths.items():
        if length > best_len or (length == best_len and length and loads[replica] < loads[best]):
            best, best_len = replica, length
    if best_len and loads[best] - min(loads.values()) <= slack:
        return best
    return idle[0]


def block_hashes(tokens: Sequence[int]) -> list[int]:
    """Hashes of tokens[:BLOCK], tokens[:2*BLOCK], ... (each chained from the one before)."""
    hashes = []
    h = 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        h = hash((h, *tokens[end - BLOCK : end]))
        hashes.append(h)
    return hashes


class PrefixMemory:
    """What one replica was sent, as block-prefix hashes, the least recently used dropped first."""

    def __init__(self, max_blocks: int):
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def add(self, hashes: list[int]) -> None:
        blocks = self._blocks
        # Deepest first, so a block is always more recent than those after it: eviction
        # trims prompts from their ends, and a remembered block's prefix is remembered.
        for h in reversed(hashes):
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def longest(self, hashes: list[int]) -> int:
        """How many leading blocks of the prompt this replica was sent."""
        blocks = self._blocks
        lo, hi = 0, len(hashes)  # prefixes nest (see add): if block i is known, so are those before it
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def clear(self) -> None:
        self._blocks.clear()


class PrefixRouter:
    def __init__(self, replicas: int, max_blocks: int, slack: int, affinity: bool = True):
        self.memories = [PrefixMemory(max_blocks) for _ in range(replicas)]
        self.slack = slack  # how many more requests in flight the cached replica may have
        self.affinity = affinity  # False: plain round robin, to measure the rule against
        self._next = 0  # round robin among equally loaded replicas

    def choose(self, hashes: list[int], loads: Sequence[int], usable: Sequence[bool]) -> int:
        """The replica for a prompt (its block_hashes), given each replica's requests in flight."""
        candidates = [i for i, ok in enumerate(usable) if ok]
        if not self.affinity:
            loads = [0] * len(loads)
            hashes = []
        least = min(loads[i] for i in candidates)
        n = len(loads)
        start = self._next
        self._next = (start + 1) % n
        idle = [i for i in ((start + k) % n for k in range(n)) if i in candidates and loads[i] == least]
        lengths = {i: self.memories[i].longest(hashes) for i in candidates} if hashes else {}
        return pick(lengths, {i: loads[i] for i in candidates}, self.slack, idle)

    def sent(self, replica: int, hashes: list[int]) -> None:
        """Remember that the replica got (or generated) these blocks."""
        self.memories[replica].add(hashes)

    def forget(self, replica: int) -> None:
        """The replica's engine restarted or stopped: its cache is empty."""
        self.memories[replica].clear()
