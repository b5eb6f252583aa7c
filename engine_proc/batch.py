"""A llama_batch backed by numpy arrays that live as long as it does.

Filling it is a few vectorised slice writes per sequence: no per-token
ctypes calls, nothing allocated per step.
"""

from __future__ import annotations

import ctypes

import llama_cpp as L
import numpy as np


class Batch:
    def __init__(self, n: int):
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

    def decode(self, ctx, n_tokens: int) -> None:
        """llama_decode of the batch's first ``n_tokens`` tokens."""
        self.batch.n_tokens = n_tokens
        rc = L.llama_decode(ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")
