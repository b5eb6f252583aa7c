"""llama-server's /slots/{id}?action=save|restore|erase: a KV stream's cache entry to a named file and back.

In cLLM a slot is one of the engine's KV streams 0..parallel-1, where its
running sequences decode. When a sequence ends, its stream keeps its cells
as a prefix cache entry (prefix_cache). Save writes that entry, its tokens
and cells, to a file in the disk cache's format (kv_file), under the disk
cache's fingerprint of the model and every setting that changes cells
(disk_cache.identity), so a file made with another model or other settings
is refused, never restored, and so is a file any byte of which changed
since it was written (kv_file's hashes). Restore makes the file's cells the stream's
entry, so that the next prompt that starts with its tokens reuses them
(and reports them cached); erase drops the stream's entry.

An action on a stream that runs a sequence, or whose cells a copy has not
settled yet, waits until it is free, as llama-server defers it. Actions
run on the engine's thread between steps, never inside one: a save or a
restore holds the steps up for as long as it takes, which its timings report.
"""

from __future__ import annotations

import os
import time

import numpy as np

from cllm.core.protocol import SlotAction, SlotDone
from engine_proc.kv.kv_file import check_cells, file_head, read_tokens, write_file
from engine_proc.kv.prefix_cache import PrefixCache
from engine_proc.kv.slots import KvStreams


class SlotFiles:
    def __init__(self, parallel: int, cache: PrefixCache | None, kv: KvStreams, fingerprint: str):
        self.parallel, self.cache, self.kv, self.fingerprint = parallel, cache, kv, fingerprint
        self.pending: list[SlotAction] = []  # in arrival order

    def run(self, busy: set[int]) -> list[SlotDone]:
        """The pending actions whose streams are free (not in ``busy``, the running sequences'), done; the others
        wait for the next call."""
        done, waiting = [], []
        for msg in self.pending:
            valid = 0 <= msg.slot < self.parallel
            if valid and (msg.slot in busy or not self.kv.settled(msg.slot)):
                waiting.append(msg)
            else:
                done.append(self._act(msg) if valid else SlotDone(msg.id, status=400, error="Invalid slot ID"))
        self.pending = waiting
        return done

    def _act(self, msg: SlotAction) -> SlotDone:
        cache = self.cache
        if cache is None:
            return SlotDone(
                msg.id, status=501, error="slot actions need the prefix cache: this model's engine runs without it"
            )
        t0 = time.perf_counter()
        name = os.path.basename(msg.path)
        if msg.action == "save":
            entry = cache.entries.get(msg.slot)
            if entry is None:  # a free stream without an entry may hold stale cells: none of them is saved
                self.kv.clear(msg.slot)
            tokens = entry.tokens if entry is not None else np.empty(0, np.int32)
            data = self.kv.save(msg.slot)
            try:
                os.makedirs(os.path.dirname(msg.path), exist_ok=True)
                n_bytes = write_file(msg.path, file_head(self.fingerprint, tokens, data), tokens, data)
            except OSError as e:
                return SlotDone(msg.id, status=500, error=f"Unable to save slot to {name}: {e.strerror or e}")
        elif msg.action == "restore":
            try:
                tokens, data, n_bytes = self._read(msg.path)
            except FileNotFoundError:
                return SlotDone(msg.id, status=400, error=f"Unable to restore slot: no file {name}")
            except (OSError, ValueError) as e:
                return SlotDone(
                    msg.id, status=400, error=f"Unable to restore slot from {name}: {getattr(e, 'strerror', None) or e}"
                )
            cache.entries.pop(msg.slot, None)  # its cells are overwritten, as in llama-server
            if not self.kv.restore(msg.slot, data):
                self.kv.clear(msg.slot)
                return SlotDone(
                    msg.id, status=400, error=f"Unable to restore slot from {name}: llama.cpp could not load its cells"
                )
            if len(tokens):
                cache.keep(msg.slot, tokens)
        elif msg.action == "erase":
            entry = cache.entries.pop(msg.slot, None)
            self.kv.clear(msg.slot)
            tokens, n_bytes = (entry.tokens if entry is not None else np.empty(0, np.int32)), 0
        else:
            return SlotDone(msg.id, status=400, error="Invalid action")
        return SlotDone(msg.id, len(tokens), n_bytes, (time.perf_counter() - t0) * 1000)

    def _read(self, path: str) -> tuple[np.ndarray, np.ndarray, int]:
        """A file's tokens, its cells and its size; ValueError if it is not a whole file of this fingerprint
        or any of its bytes changed (its cells are checked against their hash before they go into a stream)."""
        with open(path, "rb") as f:
            header, tokens = read_tokens(f, self.fingerprint)
            data = np.frombuffer(f.read(header.n_bytes), np.uint8)
            size = f.tell()
        check_cells(header, data)
        return tokens, data, size
