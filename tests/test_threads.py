"""The engine's thread count on the real engine beside real busy programs (the rule alone:
tests/unit/test_thread_rule.py)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from cllm.core.protocol import SamplingParams, Submit
from engine_proc.engine import LLMEngine

WAIT = 60.0  # seconds a real engine may take to see the CPUs taken, or free again


needs_cpus = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: the engine runs on one thread anyway")


def _engine(**settings) -> LLMEngine:
    return LLMEngine(resolve_model(None), ServeConfig(parallel=2, ctx_size=4096, prefix_cache=False, **settings))


def _greedy(engine: LLMEngine, prompts: list[list[int]], first_id: int, decode_on: int = 0) -> list[list]:
    """Each prompt's 24 greedy tokens with their top-2 logprobs, decoded together; ``decode_on``: the prompts
    prefilled on one thread, then decoded on that many."""
    got: dict[int, list] = {first_id + i: [] for i in range(len(prompts))}
    if decode_on:
        engine.runner.set_threads(1)
    for i, prompt in enumerate(prompts):
        engine.add(
            Submit(first_id + i, prompt, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2))
        )
    while engine.has_work():
        for out in (o for result in engine.step() for o in result.outputs):
            if out.token is not None:
                got[out.id].append((out.token, out.logprobs))
        if decode_on and all(got.values()):
            engine.runner.set_threads(decode_on)
    return [got[first_id + i] for i in range(len(prompts))]


@needs_cpus
def test_the_thread_count_changes_no_output(tok):
    # Under 512 KV cells: past them, flash attention splits a decode's cells between the threads (docs/internals.md:
    # Threads).
    engine = _engine(fixed_threads=True)
    try:
        prompts = [tok.encode("Write a story about a dragon."), tok.encode("List the planets of the solar system.")]
        all_threads = _greedy(engine, prompts, 1)
        engine.runner.set_threads(1)
        one = _greedy(engine, prompts, 10)
    finally:
        engine.close()
    assert one == all_threads  # tokens and logprobs, bit for bit


@needs_cpus
def test_without_flash_attention_the_thread_count_changes_no_output_past_512_cells(tok):
    """Flash attention splits a decode over 512+ cells between the threads; the plain attention does not.

    The decodes are what is compared: both runs prefill on one thread (a prefill's thread count is the test
    above's), as two held threads beside a busy program took several times as long over the prompt.
    """
    engine = _engine(fixed_threads=True, flash_attn="off")
    try:
        prompt = tok.encode(
            "Notes on price. " + " ".join(f"Fact {i}: the price of item {i} is {i * 7 % 13}." for i in range(33))
        )
        assert len(prompt) > 512  # just past them (518 tokens): every decode reads 512+ cells, no prefill to spare
        all_threads = _greedy(engine, [prompt], 1, decode_on=engine.runner.threads.most)
        one = _greedy(engine, [prompt], 10, decode_on=1)
    finally:
        engine.close()
    assert one == all_threads


def _decode_until(engine: LLMEngine, done, timeout: float) -> None:
    """Keep one long request decoding until ``done()``, for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    next_id = 100
    while not done():
        assert time.monotonic() < deadline, (
            f"not true after {timeout} s; the engine is on {engine.runner.threads.n} threads"
        )
        if not engine.has_work():
            next_id += 1
            engine.add(
                Submit(next_id, list(range(100, 140)), SamplingParams(max_tokens=512, temperature=0, ignore_eos=True))
            )
        list(engine.step())


@needs_cpus
def test_a_new_engine_beside_busy_programs_serves_on_fewer_threads_from_the_start():
    """Its first request's first llama_decode, maybe a long one, does not wait at every barrier (Threads.probe)."""
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True) for _ in range(os.cpu_count())]
    try:
        engine = _engine()
    finally:
        for p in busy:
            p.kill()
            p.wait()
    try:
        assert (
            engine.runner.threads.n < engine.runner.threads.most and engine.stats().threads == engine.runner.threads.n
        )
    finally:
        engine.close()


@needs_cpus
def test_beside_busy_programs_the_engine_decodes_on_fewer_threads_and_on_all_once_they_end():
    engine = _engine()
    most = engine.runner.threads.most
    # As many busy programs as CPUs, in a session of their own: another user's work.
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True) for _ in range(os.cpu_count())]
    try:
        _decode_until(engine, lambda: engine.runner.threads.n < most, WAIT)
        assert engine.stats().threads == engine.runner.threads.n
    finally:
        for p in busy:
            p.kill()
            p.wait()
    try:
        _decode_until(engine, lambda: engine.runner.threads.n == most, WAIT)
        assert engine.stats().threads == most
    finally:
        engine.close()
