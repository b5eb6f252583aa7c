"""Host-RAM copies of the prefix cache's entries that the KV streams had no room for.

The streams hold the running sequences and ``--cache-slots`` entries. An
entry pushed out of them (more conversations than slots, or a long
document between two of its questions) is copied to host memory
(llama_state_seq_get_data), and a prompt it serves better than any stream
gets it back (llama_state_seq_set_data): a memory copy of its cells instead
of prefilling them again, as llama-server's ``--cache-ram`` does. Past the
byte budget the least recently stored entry goes first.

With ``--cache-dir`` an entry stored here is also handed to the disk cache
(disk_cache), which writes it on a thread of its own, and a lookup that a
file serves better than host RAM gives that file's entry, its cells read
only once the prefix cache chooses it (load).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engine_proc.kv.disk_cache import DiskCache, OnDisk
from engine_proc.sequence import common_prefix, starts_with

# Entries are filed under their first HEAD tokens, so that a lookup compares a
# prompt only with entries that start as it does.
HEAD = 32

# Entries shorter than this are not kept. A copy costs its pages' first
# touch, many times the copy into memory used before, whether or not it
# ever comes back: under a load of fresh short requests, whose entries never
# come back, that is engine time spent for nothing. Documents and
# conversations, which do come back, are mostly longer; a shorter entry
# prefills again in one block. (At least HEAD.)
MIN_CELLS = 128


@dataclass(slots=True, eq=False)
class Stored:
    tokens: np.ndarray  # the tokens whose KV cells ``data`` holds, position by position
    data: np.ndarray | None  # bytes, as llama_state_seq_get_data wrote them (None: in ``disk``'s file, not read yet)
    disk: OnDisk | None = None  # the file it comes from, if it is not in host RAM
    logits: np.ndarray | None = None  # its stream's entry's (prefix_cache.Entry), which go with it
    upto: int = 0

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (0 if self.logits is None else self.logits.nbytes)


class HostCache:
    def __init__(self, max_bytes: int, disk: DiskCache | None = None):
        self.max_bytes = max_bytes
        self.disk = disk
        self.entries: OrderedDict[int, Stored] = OrderedDict()  # id(stored) -> stored, oldest first
        self._by_head: dict[bytes, dict[int, Stored]] = {}
        self.bytes = 0

    def _alike(self, tokens: np.ndarray) -> list[Stored]:
        """The entries that start as ``tokens`` do (none if it is shorter than HEAD)."""
        if len(tokens) < HEAD:
            return []
        return list(self._by_head.get(tokens[:HEAD].tobytes(), {}).values())

    def holds(self, tokens: np.ndarray) -> bool:
        """Whether an entry has all of ``tokens``' cells (they are its prefix)."""
        return any(starts_with(e.tokens, tokens) for e in self._alike(tokens))

    def wants(self, tokens: np.ndarray) -> bool:
        """Whether ``put`` would keep these tokens' cells, here or on disk (asked before they are copied out)."""
        in_ram = self.max_bytes > 0 and len(tokens) >= MIN_CELLS and not self.holds(tokens)
        return in_ram or (self.disk is not None and self.disk.wants(tokens))

    def put(self, tokens: np.ndarray, data: np.ndarray, logits: np.ndarray | None = None, upto: int = 0) -> None:
        """Keep the cells (and write them to disk), with the logits after their first ``upto`` tokens if the entry
        kept them; entries whose tokens are a prefix of these go, as they add nothing."""
        if self.disk is not None:
            self.disk.put(tokens, data)
        if data.nbytes > self.max_bytes or len(tokens) < MIN_CELLS or self.holds(tokens):
            return
        for e in self._alike(tokens):
            if starts_with(tokens, e.tokens):
                self.take(e)
        stored = Stored(tokens, data, logits=logits, upto=upto)
        self.entries[id(stored)] = stored
        self._by_head.setdefault(tokens[:HEAD].tobytes(), {})[id(stored)] = stored
        self.bytes += stored.nbytes
        while self.bytes > self.max_bytes:
            self.take(next(iter(self.entries.values())))

    def lookup(self, prompt: np.ndarray, longest: int, unit: int, whole: bool = False) -> tuple[Stored | None, int]:
        """The entry sharing the longest prefix with ``prompt`` (at most ``longest``, a multiple of ``unit``; with
        ``whole``, all of it if the entry kept the logits after it), and its length;
        a file's if it shares more than host RAM's (its cells not read yet: see load)."""
        best, n_best = None, 0
        for e in self._alike(prompt):
            shared = common_prefix(prompt, e.tokens)
            n = len(prompt) if whole and e.upto == len(prompt) == shared else min(shared, longest) // unit * unit
            if n > n_best:
                best, n_best = e, n
        if self.disk is not None:
            on_disk, n = self.disk.lookup(prompt, longest, unit)
            if n > n_best:
                return Stored(on_disk.tokens, None, on_disk), n
        return best, n_best

    def load(self, stored: Stored) -> bool:
        """Map a file's entry's cells into memory; False if the file is gone or wrong."""
        if stored.data is None:
            stored.data = self.disk.load(stored.disk)
        return stored.data is not None

    def take(self, stored: Stored) -> None:
        """The entry leaves host RAM (a file's entry: nothing to do here; the file stays)."""
        if stored.disk is not None:
            return
        del self.entries[id(stored)]
        head = stored.tokens[:HEAD].tobytes()
        alike = self._by_head[head]
        del alike[id(stored)]
        if not alike:
            del self._by_head[head]
        self.bytes -= stored.nbytes

    def cells(self) -> int:
        return sum(len(e.tokens) for e in self.entries.values())
