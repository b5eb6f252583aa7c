"""LoRA adapters on the model, and the adapter sets sequences decode under (``--lora``, ``--lora-scaled``, a
request's ``lora``, run-time loads).

llama.cpp sets adapters on a context, not on a sequence: every llama_decode runs under one set, the adapters
and scales llama_set_adapters_lora gave the context last (a set that differs from the last one makes it
reserve its compute graph again). So a step runs one llama_decode for each adapter set among its chunks
(``groups``), each after ``apply``: every sequence still gets its token every step, and sequences under the
same set share their call. (Alternating steps between sets would save the calls' fixed cost but stall each
set's streams for the others' steps.) An engine without adapters has no Adapters: its runs never look.

A set is what a Submit's ``lora`` names, (adapter id, scale) pairs without zero scales, numbered as it is first
seen (0: no adapter). Its ``mark`` keys its cells in the prefix cache (Sequence.key): a hash of the adapters'
files (path, size, mtime) and scales, the same in every engine that loads the same files, so that files in
``--cache-dir`` keep their cells apart across restarts too.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import llama_cpp as L

from cllm.core.config import ServeConfig
from engine_proc.run.model_runner import ModelLoadError, ModelRunner
from engine_proc.sequence import Chunk

Pairs = tuple[tuple[int, float], ...]  # (adapter id, scale), ids ascending, no zero scale


class LoraError(ValueError):
    """An adapter file llama.cpp refuses, or a set naming an adapter not loaded: said in one sentence."""


@dataclass(slots=True)
class AdapterSet:
    number: int  # Sequence.lora
    pairs: Pairs
    mark: int
    adapters: ctypes.Array | None  # the adapters' pointers and scales, as llama_set_adapters_lora takes them
    scales: ctypes.Array | None


class Adapters:
    def __init__(self, model, ctx, files: list[tuple[str, float]]):
        """``files``: the adapters loaded at the start, ids 0, 1, ... (their scales are the frontend's)."""
        self.model, self.ctx = model, ctx
        self.loaded: dict[int, Any] = {}  # id -> llama_adapter_lora pointer
        self._ident: dict[int, list] = {}  # id -> its file's path, size and mtime: what the mark is made of
        self._sets: dict[Pairs, int] = {(): 0}
        self.sets: dict[int, AdapterSet] = {0: AdapterSet(0, (), 0, None, None)}
        self._numbered = 0  # sets numbered so far: a number is never given twice
        self.current = 0  # the set on the context
        for i, (path, _) in enumerate(files):
            self.load(i, path)

    def load(self, id: int, path: str) -> None:
        """Load ``path`` as adapter ``id``; LoraError if llama.cpp refuses it (not an adapter, another model's)."""
        if id in self.loaded:
            raise LoraError(f"adapter id {id} is loaded already")
        ptr = L.llama_adapter_lora_init(self.model, path.encode())
        if not ptr:
            raise LoraError(f"llama.cpp could not load {path} as a LoRA adapter of this model")
        st = os.stat(path)
        self.loaded[id] = ptr
        self._ident[id] = [os.path.realpath(path), st.st_size, st.st_mtime_ns]

    def unload(self, id: int) -> list[int]:
        """Free adapter ``id``; the numbers of the sets that used it (their sequences must go first)."""
        ptr = self.loaded.pop(id, None)
        if ptr is None:
            return []
        gone = self.using(id)
        if self.current in gone:
            self.apply(0)
        for n in gone:
            del self._sets[self.sets.pop(n).pairs]
        del self._ident[id]
        L.llama_adapter_lora_free(ptr)
        return gone

    def using(self, id: int) -> list[int]:
        """The numbers of the sets adapter ``id`` is in."""
        return [n for n, s in self.sets.items() if any(i == id for i, _ in s.pairs)]

    def set_of(self, lora: list[tuple[int, float]]) -> AdapterSet | None:
        """The set a request names (None for no adapter); LoraError if it names an adapter not loaded."""
        pairs = tuple(sorted((i, s) for i, s in lora if s != 0.0))
        n = self._sets.get(pairs)
        if n is not None:
            return self.sets[n] if n else None
        missing = [i for i, _ in pairs if i not in self.loaded]
        if missing:
            raise LoraError(f"no LoRA adapter with id {missing[0]} is loaded")
        self._numbered += 1
        n = self._numbered
        digest = hashlib.sha256(json.dumps([[self._ident[i], s] for i, s in pairs]).encode()).digest()
        mark = int.from_bytes(digest[:8], "little") or 1  # 0 is no set
        adapters = (L.llama_adapter_lora_p_ctypes * len(pairs))(*(self.loaded[i] for i, _ in pairs))
        scales = (ctypes.c_float * len(pairs))(*(s for _, s in pairs))
        self._sets[pairs] = n
        self.sets[n] = s = AdapterSet(n, pairs, mark, adapters, scales)
        return s

    def apply(self, n: int) -> None:
        """Set ``n``'s adapters on the context, unless they are on it."""
        if n == self.current:
            return
        s = self.sets[n]
        L.llama_set_adapters_lora(self.ctx, s.adapters, len(s.pairs), s.scales)
        self.current = n

    @staticmethod
    def groups(chunks: list[Chunk]) -> list[tuple[int, list[Chunk]]]:
        """The chunks by adapter set, each group in the chunks' order (slot order stays), a llama_decode each."""
        first = chunks[0].seq.lora
        if all(c.seq.lora == first for c in chunks):
            return [(first, chunks)]
        by: dict[int, list[Chunk]] = {}
        for c in chunks:
            by.setdefault(c.seq.lora, []).append(c)
        return list(by.items())

    def close(self) -> None:
        self.apply(0)
        for ptr in self.loaded.values():
            L.llama_adapter_lora_free(ptr)
        self.loaded.clear()


def request_set(adapters: Adapters | None, lora: list[tuple[int, float]] | None) -> tuple[int, int]:
    """(the set's number, its prefix-cache mark) a request's ``lora`` decodes under, (0, 0) for the model alone;
    LoraError naming what is wrong."""
    if not lora:
        return 0, 0
    if adapters is None:
        raise LoraError("the model has no LoRA adapters")
    s = adapters.set_of(lora)
    return (0, 0) if s is None else (s.number, s.mark)


def make_adapters(config: ServeConfig, runner: ModelRunner) -> Adapters | None:
    """The engine's adapters: None with none loaded or loadable (no run then looks for adapter sets);
    ModelLoadError if a --lora file does not load."""
    if not (config.lora_files or config.allow_lora_load):
        return None
    try:
        return Adapters(runner.model, runner.ctx, config.lora_files)
    except LoraError as e:
        runner.close()
        raise ModelLoadError(str(e)) from None
