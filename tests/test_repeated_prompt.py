"""A prompt asked again is served whole by the prefix cache, and answers as it did (real model, in-process).

The cache's entry keeps the logits its prompt's prefill gave, so the same
prompt again reuses every cell and picks its first token from them, with no
decode; decoding the last token again would give its cells other last bits
than the prompt's chunk did, and the embedded model's greedy answer to a copy
task then parted from the first one (engine_proc/kv/prefix_cache.py: lookup).
Requests whose sampler reads its rows from llama.cpp (logprobs, penalties,
grammars) decode the last token again, as before.
"""

from __future__ import annotations

import pytest

from cllm.core.protocol import SamplingParams, SeqOutput, Submit
from perf.speculative import copy_tasks

GREEDY = SamplingParams(max_tokens=48, temperature=0.0)
_ids = iter(range(1, 10**6))
DECODES = [0]  # the module engine's llama_decode calls


@pytest.fixture(scope="module")
def engine():
    """One sequence and no cache slots: the next new prompt pushes an entry out of its stream into host RAM. On one
    thread, held: a decode over 512 cells or more adds up the threads' parts, so another number gives other last
    bits (engine_proc/run/threads.py); and two held threads beside the other tests' servers wait at every barrier
    for a core, which made this file several times as long under `make test` as alone."""
    from cllm.core.config import ServeConfig
    from cllm.core.model_file import resolve_model
    from engine_proc.engine import LLMEngine

    eng = LLMEngine(resolve_model(None), ServeConfig(parallel=1, ctx_size=2048, threads=1, fixed_threads=True))
    decode = eng.runner.decode

    def counted() -> None:
        DECODES[0] += 1
        decode()

    eng.runner.decode = counted  # the real llama_decode, counted
    try:
        yield eng
    finally:
        eng.close()


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    """Copy tasks as the chat door renders them (~600 tokens); the first one's answer parted when asked again."""
    template = tok.chat_template()
    return [tok.encode(template.render([{"role": "user", "content": p}])) for p in copy_tasks(1)]


def ask(engine, prompt: list[int], params: SamplingParams = GREEDY) -> tuple[list[SeqOutput], int]:
    """The request's outputs, and the llama_decode calls it took."""
    rid, before = next(_ids), DECODES[0]
    engine.add(Submit(rid, prompt, params))
    outs: list[SeqOutput] = []
    for _ in range(400):
        if not engine.has_work():
            return outs, DECODES[0] - before
        outs += [o for result in engine.step() for o in result.outputs if o.id == rid]
    raise AssertionError("the engine did not finish")


def text(outs: list[SeqOutput]) -> list[int]:
    return [o.token for o in outs if o.token is not None]


def test_a_repeated_prompt_reuses_every_cell_and_answers_as_before(engine, prompts):
    prompt = prompts[0]
    first, _ = ask(engine, prompt)
    again, decodes = ask(engine, prompt)
    assert first[0].cached_tokens < len(prompt) // 2
    assert again[0].cached_tokens == len(prompt)
    assert text(again) == text(first) and len(text(first)) == GREEDY.max_tokens
    assert decodes == len(text(again)) - 1  # the first token from the kept logits, each later one from a decode


def test_an_entry_from_host_ram_brings_its_logits_back(engine, prompts):
    a, b = prompts[1], prompts[2]
    first, _ = ask(engine, a)
    ask(engine, b)  # a's entry leaves the one stream for host RAM
    again, decodes = ask(engine, a)
    assert again[0].cached_tokens == len(a)
    assert text(again) == text(first) and decodes == len(text(again)) - 1
    assert engine.scheduler.cache.stats().restored >= 1


def test_one_token_from_the_kept_logits_ends_the_request_and_leaves_the_entry(engine, prompts):
    prompt = prompts[0]
    full, _ = ask(engine, prompt)
    one = SamplingParams(max_tokens=1, temperature=0.0)
    [out], decodes = ask(engine, prompt, one)
    assert (out.token, out.finish, out.cached_tokens, decodes) == (full[0].token, "length", len(prompt), 0)
    again, _ = ask(engine, prompt)
    assert again[0].cached_tokens == len(prompt) and text(again) == text(full)


def test_a_seeded_sampled_request_repeats_its_text(engine, prompts):
    sampled = SamplingParams(max_tokens=32, temperature=0.9, top_p=0.95, seed=11)
    prompt = prompts[3]
    first, _ = ask(engine, prompt, sampled)
    again, _ = ask(engine, prompt, sampled)
    assert again[0].cached_tokens == len(prompt) and text(again) == text(first)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=8, temperature=0.0, logprobs=2),
        SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=1.3),
    ],
    ids=["logprobs", "penalty"],
)
def test_a_sampler_that_reads_llama_cpps_rows_decodes_the_last_token_again(engine, prompts, params):
    prompt = prompts[0]
    ask(engine, prompt, params)
    again, decodes = ask(engine, prompt, params)
    assert again[0].cached_tokens == len(prompt) - 1 and decodes == len(text(again))
    if params.logprobs:
        assert all(o.logprobs is not None and len(o.logprobs.top_ids) == 2 for o in again)
