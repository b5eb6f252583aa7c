"""`--warmup`: the engine decodes a long prompt at its start and drops it, so that the first long prompt served pays no
first-use costs (on a GPU: kernels loaded, memory pool grown). On by default with GPU layers only; turned on here,
on the CPU, it must leave every stream empty and change no request's tokens."""

from __future__ import annotations

import llama_cpp as L

from cllm.core.config import Warmup
from tests.test_steady_steps import LENGTHS, _drive, _submits


def _engine(warmup: Warmup):
    from cllm.core.config import ServeConfig
    from cllm.core.model_file import resolve_model
    from engine_proc.engine import LLMEngine

    return LLMEngine(resolve_model(None), ServeConfig(parallel=12, ctx_size=12 * 300, warmup=warmup))


def test_the_warm_up_leaves_the_cache_empty_and_the_tokens_as_they_were(tok):
    warmed = _engine("on")
    try:
        r = warmed.runner
        assert r.warmed is not None and r.warmed[0] == r.seq_ctx  # a stream's cells but the last, then one token
        assert all(L.llama_memory_seq_pos_max(r.memory, s) == -1 for s in range(r.n_streams))
        with_it = _drive(warmed, _submits(tok, 0))
    finally:
        warmed.close()
    cold = _engine("auto")  # no GPU layers here: no warm-up
    try:
        assert cold.runner.warmed is None
        without = _drive(cold, _submits(tok, 0))
    finally:
        cold.close()
    assert with_it == without


def test_a_warm_up_that_fails_leaves_an_empty_cache_and_a_serving_engine(tok, monkeypatch):
    from engine_proc.run.batch import Batch

    decode, calls = Batch.decode, []

    def failing_second(self, ctx, n_tokens):  # llama_decode's error code, as a full device would give it
        calls.append(n_tokens)
        if len(calls) == 2:
            raise RuntimeError("llama_decode failed with code 1")
        decode(self, ctx, n_tokens)

    monkeypatch.setattr(Batch, "decode", failing_second)
    engine = _engine("on")
    try:
        r = engine.runner
        assert len(calls) == 2 and r.warmed is None
        assert all(L.llama_memory_seq_pos_max(r.memory, s) == -1 for s in range(r.n_streams))
        got = _drive(engine, _submits(tok, 0))
    finally:
        engine.close()
    assert [len(tokens) for tokens in got.values()] == LENGTHS
