"""The logits rows the engine's llama.cpp context reserves (n_outputs_max): a row a KV stream, and a scored prompt
chunk's or a step's drafts beyond them (engine_proc/sequence.py), not llama.cpp's default of a row for every token of
a step, whose compute buffer (on the GPU when layers are) held n_vocab floats for each; and a decode that asked for
more rows than that is an error, not llama.cpp's abort of the whole process."""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

from cllm.core.config import ServeConfig
from cllm.core.llama_log import reported
from cllm.core.model_file import resolve_model
from engine_proc.run.model_runner import compute_bytes
from engine_proc.sequence import DRAFT_ROWS, SCORED_ROWS

_said: list[str] = []


def _runner(monkeypatch, config: ServeConfig):
    """A ModelRunner, with what llama.cpp said while it made its context."""
    import engine_proc.run.model_runner as mr

    @contextlib.contextmanager
    def kept():
        with reported() as lines:
            yield lines
        _said.extend(lines)

    _said.clear()
    monkeypatch.setattr(mr, "reported", kept)
    return mr.ModelRunner(resolve_model(None), config), "".join(_said)


def _said_value(said: str, what: str) -> float:
    found = re.search(rf"{what}\s*=\s*([\d.]+)", said)
    assert found, f"llama.cpp said nothing of {what}"
    return float(found.group(1))


@pytest.mark.parametrize("spec", ["none", "ngram"])
def test_the_context_reserves_a_row_a_stream_and_a_chunks_or_drafts_rows(monkeypatch, spec):
    config = ServeConfig(parallel=64, ctx_size=64 * 300, spec_type=spec, spec_memory=0)
    runner, said = _runner(monkeypatch, config)
    try:
        extra = DRAFT_ROWS if spec == "ngram" else SCORED_ROWS
        assert _said_value(said, "n_outputs_max") == runner.n_streams + extra
        # SmolLM2's 49,152-entry rows: 12 MiB a 64 rows. With a row for each of a step's 512 tokens the buffer was 98
        # MiB at 64 sequences (llama-server's, a row a sequence: 18 MiB).
        assert runner.info.compute_bytes == compute_bytes(said) > 0  # every device's, as llama.cpp says it
        assert runner.info.compute_bytes < (40 if spec == "ngram" else 30) * 2**20
    finally:
        runner.close()


def test_the_draft_models_context_reserves_a_row_a_stream(monkeypatch):
    """The draft model decodes a logits row a sequence at most (engine_proc/step/draft_model.py); its context reserves
    no more (its vocabulary is the target's: a whole step's rows of it were 98 MiB at 64 sequences here)."""
    import engine_proc.run.draft_runner as dr

    config = ServeConfig(parallel=64, ctx_size=64 * 300)
    runner, _ = _runner(monkeypatch, config)
    try:
        with reported() as lines:  # the draft runner leaves llama.cpp's log as it finds it
            draft = dr.DraftRunner(resolve_model(None), runner, config)  # the embedded model drafts for itself
        said = "".join(lines)
        draft.close()
    finally:
        runner.close()
    assert _said_value(said, "n_outputs_max") == config.parallel
    assert 0 < compute_bytes(said) < 30 * 2**20


def test_a_decode_asking_for_more_rows_is_an_error_and_the_context_serves_on(monkeypatch):
    runner, _ = _runner(monkeypatch, ServeConfig(parallel=2, ctx_size=1024))
    try:
        rows = runner.n_streams + SCORED_ROWS
        with pytest.raises(RuntimeError, match=f"asked for {rows + 1} logits rows, more than the context's {rows}"):
            runner.decode_tokens(list(range(100, 101 + rows)), 0, 0, True)
        runner.clear(0)
        got = runner.decode_tokens(list(range(100, 100 + rows)), 0, 0, True)
        assert got is not None and got.shape == (rows, runner.n_vocab) and np.isfinite(got).all()
    finally:
        runner.close()
