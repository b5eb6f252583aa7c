"""The model runner's KV streams moving on llama.cpp: a swap and a copy leave each stream's cells as they were where
they land, and streams in host memory need no stream beyond those the settings ask (llama-server's cells).

Each check decodes one more token after a stream's cells and compares its logits with the same token decoded after
the cells where they were made: a cell lost, moved to another position or mixed with the other stream's changes them.
Flash attention is off so that the one-token decodes compare bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from engine_proc.run.model_runner import ModelRunner

NEXT = 42  # the token decoded after each stream's cells


@pytest.fixture(scope="module")
def runner():
    r = ModelRunner(resolve_model(None), ServeConfig(parallel=2, ctx_size=1024, flash_attn="off"))
    yield r
    r.close()


def prompt(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 40000, n).tolist()


def filled(runner: ModelRunner, slot: int, tokens: list[int]) -> np.ndarray:
    """Stream ``slot`` := the tokens' cells; the logits of NEXT after them (its cell dropped again)."""
    runner.clear(slot)
    runner.decode_tokens(tokens, 0, slot, logits=False)
    return after(runner, slot, len(tokens))


def after(runner: ModelRunner, slot: int, n: int) -> np.ndarray:
    logits = runner.decode_tokens([NEXT], n, slot, logits=True)
    assert logits is not None
    runner.trim(slot, n)
    return logits[0]


def test_streams_in_host_memory_are_the_cells_asked_for(runner):
    if runner.info.gpu_layers:
        pytest.skip("streams in device memory trade places through one more")
    import llama_cpp as L

    assert runner.n_streams == 2 and runner.scratch is None
    assert L.llama_n_ctx(runner.ctx) == 1024  # two sequences of 512 cells, as llama-server's -c 1024 -np 2


def test_two_streams_trade_places_whole(runner):
    """One stream more than half full (the case a whole-stream copy moves faster), one short."""
    long, short = prompt(1, 400), prompt(2, 30)
    want_long, want_short = filled(runner, 0, long), filled(runner, 1, short)
    runner.swap(0, 1)
    assert np.array_equal(after(runner, 1, len(long)), want_long)
    assert np.array_equal(after(runner, 0, len(short)), want_short)
    runner.swap(1, 0)
    assert np.array_equal(after(runner, 0, len(long)), want_long)
    assert np.array_equal(after(runner, 1, len(short)), want_short)


def test_a_copy_keeps_the_first_cells_and_leaves_its_source(runner):
    long = prompt(3, 400)
    want_long = filled(runner, 0, long)
    want_head = filled(runner, 1, long[:150])
    filled(runner, 1, prompt(4, 60))  # what the copy replaces
    runner.copy(0, 1, 150)
    assert np.array_equal(after(runner, 1, 150), want_head)
    assert np.array_equal(after(runner, 0, len(long)), want_long)
