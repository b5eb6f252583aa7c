"""A repeated prompt's first token, bit for bit, wherever the prefix cache took its cells from.

With flash attention on (the default) a token's cells depend on the kernel
that computed them: llama.cpp's CPU flash attention runs a ubatch of 64 or
more query rows of one stream through a tiled kernel and fewer row by row,
and the two give other last bits (docs/internals.md: What is exact). Every
prompt here is prefilled in fewer than 64 rows and every reused cell was
computed so, so the repeated prompt's logprobs and cells (their positions,
K and V) must be its fresh prefill's bit for bit, whether its cells stayed
in their stream, were copied from another one, came back from host RAM or
from a file: a cell restored or copied at another position (its K rotated
for another place), or one left out, changes them.
"""

from __future__ import annotations

import pytest

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from cllm.core.protocol import SamplingParams, Submit
from engine_proc.engine import LLMEngine

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


class Run:
    """An engine with the prefix cache, fed requests one batch at a time."""

    def __init__(self, **settings):
        self.engine = LLMEngine(resolve_model(None), ServeConfig(parallel=4, ctx_size=2048, **settings))
        self.next_id = 0

    def add(self, prompt: list[int], max_tokens: int) -> int:
        self.next_id += 1
        params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=2)
        self.engine.add(Submit(self.next_id, prompt, params))
        return self.next_id

    def finish(self, until: int | None = None) -> dict[int, tuple]:
        """Step until nothing runs (or ``until`` gave its first token): each request's first token's (cached tokens,
        top ids, top logprobs)."""
        first: dict[int, tuple] = {}
        while self.engine.has_work() and (until is None or until not in first):
            for out in (o for r in self.engine.step() for o in r.outputs):
                if out.logprobs is not None and out.id not in first:
                    first[out.id] = (out.cached_tokens, out.logprobs.top_ids, out.logprobs.top_logprobs)
        return first

    def first_token(self, prompt: list[int]) -> tuple:
        rid = self.add(prompt, 1)
        return self.finish()[rid]

    def cells(self, prompt: list[int]) -> bytes:
        """The cells the prompt's request left in its stream, as llama_state_seq_get_data gives them: each cell's
        position, then its K and V rows. They also name their stream, so they are read from the last stream
        whatever stream holds them (what it held put back)."""
        runner = self.engine.runner
        entries = self.engine.scheduler.cache.entries
        (slot,) = [slot for slot, entry in entries.items() if entry.tokens.tolist() == prompt]
        last = runner.n_streams - 1
        held = runner.save(last)
        assert runner.restore(last, runner.save(slot))
        try:
            return runner.save(last).tobytes()
        finally:
            assert runner.restore(last, held)

    def restored(self) -> int:
        return self.engine.stats().prefix_cache.restored

    def close(self) -> None:
        self.engine.close()


@pytest.fixture(scope="module")
def prompts(tok):
    """The repeated prompt (its last token is always prefilled), and another that shares all the rest and is
    longer, still under 64 tokens."""
    prompt = tok.encode(SYSTEM + PROMPT)
    other = prompt[:-1] + tok.encode(" Tell me more about it, please.")
    assert len(prompt) < len(other) < 64
    return prompt, other


@pytest.fixture(scope="module")
def fresh(prompts):
    """The prompt's first token and cells on a new engine, nothing cached."""
    run = Run()
    try:
        cached, ids, logprobs = run.first_token(prompts[0])
        cells = run.cells(prompts[0])
    finally:
        run.close()
    assert cached == 0
    return ids, logprobs, cells


def same_as_fresh(run: Run, prompt: list[int], fresh: tuple) -> None:
    """The repeated prompt reused all its cells but the last, and its first token and cells are the fresh ones."""
    cached, ids, logprobs = run.first_token(prompt)
    assert cached == len(prompt) - 1
    assert (ids, logprobs) == fresh[:2]  # bit for bit
    assert run.cells(prompt) == fresh[2]  # every position, every K and V bit


def test_cells_that_stay_in_their_stream(prompts, fresh):
    run = Run()
    try:
        run.first_token(prompts[0])
        same_as_fresh(run, prompts[0], fresh)
    finally:
        run.close()


def test_cells_copied_from_a_running_sequences_stream(prompts, fresh):
    prompt, other = prompts
    run = Run()
    try:
        running = run.add(other, 24)
        run.finish(until=running)  # it decodes on; the prompt gets a copy of its first cells
        same_as_fresh(run, prompt, fresh)
    finally:
        run.close()


def test_cells_back_from_host_ram(prompts, fresh, tok):
    prompt, other = prompts
    run = Run()
    try:
        run.add(other, 90)  # 128 cells or more go to host RAM when they lose their stream
        run.finish()
        for i in range(4):  # as many as the streams: each takes one, the entry goes to host RAM
            run.add(tok.encode(f"Story number {i} is about a dragon and a river."), 8)
        run.finish()
        before = run.restored()
        same_as_fresh(run, prompt, fresh)
        assert run.restored() == before + 1
    finally:
        run.close()


def test_cells_back_from_a_file(prompts, fresh, tmp_path):
    prompt, other = prompts
    run = Run(cache_dir=str(tmp_path))
    try:
        run.add(other, 90)  # 128 cells or more are written
        run.finish()
    finally:
        run.close()  # the entry goes to its file
    run = Run(cache_dir=str(tmp_path))
    try:
        same_as_fresh(run, prompt, fresh)
        assert run.engine.stats().prefix_cache.disk_hits == 1
    finally:
        run.close()
