"""A llama_batch backed by numpy arrays that live as long as it does.

Filling it is a few vectorised slice writes per chunk, and a decode batch of
one token per sequence is written column by column: no per-token ctypes
calls, no numpy call per sequence. EmbdBatch is the same for rows of embeddings (an encoded image's).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import llama_cpp as L
import numpy as np

if TYPE_CHECKING:
    from engine_proc.sequence import Chunk


class Batch:
    def __init__(self, n: int, outputs: int | None = None):
        """``n`` tokens; ``outputs``: the most logits rows a decode may ask (the context's n_outputs_max, past which
        llama.cpp aborts the process); None: any."""
        self.outputs = n if outputs is None else outputs
        # Whether a sequence's positions may lag its cells (an M-RoPE model's images: Sequence.position); else a
        # token's position is its index, with no lookup.
        self.shifted = False
        self.token = np.zeros(n, np.int32)
        self.pos = np.zeros(n, np.int32)
        self.n_seq_id = np.ones(n, np.int32)
        self.seq_id = np.zeros(n, np.int32)
        self.logits = np.zeros(n, np.int8)
        seq_id_row = ctypes.POINTER(L.llama_seq_id)
        base = self.seq_id.ctypes.data
        self._seq_id_rows = (seq_id_row * n)(*(ctypes.cast(base + 4 * i, seq_id_row) for i in range(n)))
        self.batch = L.llama_batch()
        self.batch.token = self.token.ctypes.data_as(ctypes.POINTER(L.llama_token))
        self.batch.pos = self.pos.ctypes.data_as(ctypes.POINTER(L.llama_pos))
        self.batch.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.batch.seq_id = self._seq_id_rows
        self.batch.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill(
        self, chunks: list[Chunk], positions: np.ndarray, plain: bool = False, tokens: list[int] | None = None
    ) -> tuple[int, list[int | None]]:
        """Write the chunks' tokens; (tokens written, each chunk's last logits row or None if it has none).

        A row is counted from the end of the decode's outputs (-1: the last),
        as llama_get_logits_ith takes it, and a chunk that scores or drafts has
        a row for each token, consecutive, its last one returned. ``plain``: every
        chunk is one decoding sequence's last sampled token, all sampling; ``tokens``: those tokens, where
        they are not recorded yet (a decode one step ahead).
        """
        if plain:
            n = len(chunks)
            self.token[:n] = [c.seq.output[-1] for c in chunks] if tokens is None else tokens
            self.pos[:n] = [c.start for c in chunks]
            if self.shifted:
                self.pos[:n] -= [c.seq.shift for c in chunks]
            self.seq_id[:n] = [c.seq.slot for c in chunks]
            self.logits[:n] = 1
            return n, list(range(-n, 0))
        rows: list[int | None] = []
        i = outputs = 0
        for c in chunks:
            seq, n = c.seq, c.end - c.start
            if c.start >= len(seq.prompt):  # decoding: feed the last sampled token, then the draft
                self.token[i] = seq.output[-1]
                if c.draft is not None:
                    self.token[i + 1 : i + n] = c.draft
            else:
                self.token[i : i + n] = seq.prompt[c.start : c.end]
            self.pos[i : i + n] = positions[c.start : c.end]
            if self.shifted and seq.shift:  # text never straddles an image: one lag for the chunk
                self.pos[i : i + n] -= c.start - seq.position(c.start)
            self.seq_id[i : i + n] = seq.slot
            every_row = c.every_row
            self.logits[i : i + n] = every_row
            i += n
            if every_row:
                outputs += n
                rows.append(outputs - 1)
            elif c.samples:
                self.logits[i - 1] = 1
                outputs += 1
                rows.append(outputs - 1)
            else:
                rows.append(None)
        return i, [r if r is None else r - outputs for r in rows]

    def decode(self, ctx, n_tokens: int) -> None:
        """llama_decode of the batch's first ``n_tokens`` tokens."""
        if self.outputs < n_tokens and (rows := int(np.count_nonzero(self.logits[:n_tokens]))) > self.outputs:
            raise RuntimeError(f"a decode asked for {rows} logits rows, more than the context's {self.outputs}")
        self.batch.n_tokens = n_tokens
        rc = L.llama_decode(ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")


class EmbdBatch:
    """A llama_batch of embeddings (an encoded image's rows) for one sequence, backed by numpy arrays."""

    def __init__(self, n: int, n_embd: int):
        self.embd = np.zeros((n, n_embd), np.float32)
        self.pos = np.zeros(4 * n, np.int32)  # room for M-RoPE's four components an embedding
        self.n_seq_id = np.ones(n, np.int32)
        self.seq_id = np.zeros(1, np.int32)
        self.logits = np.zeros(n, np.int8)
        row = ctypes.cast(self.seq_id.ctypes.data, ctypes.POINTER(L.llama_seq_id))
        self._seq_id_rows = (ctypes.POINTER(L.llama_seq_id) * n)(*([row] * n))
        self.batch = L.llama_batch(
            n_tokens=0,
            token=None,  # embeddings instead
            embd=self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            pos=self.pos.ctypes.data_as(ctypes.POINTER(L.llama_pos)),
            n_seq_id=self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            seq_id=self._seq_id_rows,
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def decode(self, ctx, rows: np.ndarray, pos: int | np.ndarray, seq_id: int, logits_last: bool = False) -> None:
        """llama_decode of ``rows`` (at most the batch's size) into sequence ``seq_id``: at positions pos.. (an
        int), or at M-RoPE positions (an array: a component a row, a column a row of ``rows``, as
        Vision.positions gives them, the image's first position added)."""
        n = len(rows)
        self.embd[:n] = rows
        if isinstance(pos, np.ndarray):  # llama.cpp reads a component's n positions, then the next component's
            self.pos[: pos.size] = pos.ravel()
        else:
            self.pos[:n] = np.arange(pos, pos + n, dtype=np.int32)
        self.seq_id[0] = seq_id
        self.logits[:n] = 0
        self.logits[n - 1] = logits_last
        self.batch.n_tokens = n
        rc = L.llama_decode(ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode of image embeddings failed with code {rc}")
