"""The engine's thread count: the rule on given timings, then the real engine beside real busy programs."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from cllm.core.protocol import SamplingParams, Submit
from engine_proc import threads
from engine_proc.engine import LLMEngine

WAIT = 60.0  # seconds a real engine may take to see the CPUs taken, or free again


class Machine:
    """The clock the rule reads."""

    def __init__(self):
        self.now = 100.0

    def governor(self, most: int = 2, follow: bool = True) -> tuple[threads.Threads, list[int]]:
        applied: list[int] = []
        return threads.Threads(most, applied.append, follow, clock=lambda: self.now), applied

    def decode(self, rule: threads.Threads, share: float, seconds: float = 0.3) -> None:
        """One decode of ``seconds`` in which the threads got ``share`` of their CPUs."""
        self.now += seconds
        rule.decoded(seconds, share * seconds * rule.n)


def test_threads_that_run_keep_their_count():
    m = Machine()
    rule, applied = m.governor()
    for _ in range(5):
        m.decode(rule, 0.97)
    assert applied == [] and rule.n == 2


def test_threads_that_share_their_cpus_go_down_to_the_cpus_they_get():
    m = Machine()
    rule, applied = m.governor()
    m.decode(rule, 0.5)
    assert applied == [1] and rule.n == 1
    m8 = Machine()
    rule8, applied8 = m8.governor(most=8)
    m8.decode(rule8, 0.6)
    assert applied8 == [5]  # 0.6 of 8 CPUs


def test_a_window_is_judged_whole():
    m = Machine()
    rule, applied = m.governor()
    m.decode(rule, 0.5, seconds=threads.WINDOW * 0.6)
    assert applied == []
    m.decode(rule, 0.5, seconds=threads.WINDOW * 0.6)
    assert applied == [1]


def test_all_threads_are_tried_again_after_the_wait_and_kept_if_they_run():
    m = Machine()
    rule, applied = m.governor()
    m.decode(rule, 0.5)
    m.now += threads.FIRST_WAIT - 0.5
    m.decode(rule, 1.0)  # one thread: nothing to judge, and the wait is not over
    assert applied == [1]
    m.now += 0.5
    m.decode(rule, 1.0)
    assert applied == [1, 2]  # trying them
    m.decode(rule, 0.97)
    assert rule.n == 2
    for _ in range(5):
        m.decode(rule, 0.97)
    assert applied == [1, 2]


def test_a_failed_try_doubles_the_wait_up_to_the_longest():
    m = Machine()
    rule, applied = m.governor()
    m.decode(rule, 0.5)
    waits = []
    for _ in range(6):
        went_down = m.now
        while rule.n == 1:
            m.decode(rule, 1.0, seconds=0.1)
        waits.append(round(m.now - went_down))
        m.decode(rule, 0.5)  # the try: still shared
        assert rule.n == 1
    assert waits == [2, 4, 8, 16, 16, 16]
    # Once the CPUs are free again, the next time they are taken the wait starts over.
    while rule.n == 1:
        m.decode(rule, 1.0, seconds=0.5)
    m.decode(rule, 0.97)
    m.decode(rule, 0.5)
    went_down = m.now
    while rule.n == 1:
        m.decode(rule, 1.0, seconds=0.1)
    assert round(m.now - went_down) == threads.FIRST_WAIT


def test_fixed_threads_never_change():
    m = Machine()
    rule, applied = m.governor(follow=False)
    m.decode(rule, 0.3)
    m.now += 100
    m.decode(rule, 0.3)
    assert applied == [] and rule.n == 2


# The real engine.

needs_cpus = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: the engine runs on one thread anyway")


def _engine(**settings) -> LLMEngine:
    return LLMEngine(resolve_model(None), ServeConfig(parallel=2, ctx_size=4096, prefix_cache=False, **settings))


def _greedy(engine: LLMEngine, prompts: list[list[int]], first_id: int) -> list[list]:
    """Each prompt's 48 greedy tokens with their top-2 logprobs, decoded together."""
    got: dict[int, list] = {first_id + i: [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        engine.add(Submit(first_id + i, prompt, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, logprobs=2)))
    while engine.has_work():
        for out in (o for result in engine.step() for o in result.outputs):
            if out.token is not None:
                got[out.id].append((out.token, out.logprobs))
    return [got[first_id + i] for i in range(len(prompts))]


@needs_cpus
def test_the_thread_count_changes_no_output(tok):
    engine = _engine(fixed_threads=True)
    try:
        prompts = [tok.encode("Write a story about a dragon."), tok.encode("List the planets of the solar system.")]
        all_threads = _greedy(engine, prompts, 1)
        engine.runner.set_threads(1)
        one = _greedy(engine, prompts, 10)
    finally:
        engine.close()
    assert one == all_threads  # tokens and logprobs, bit for bit


def _decode_until(engine: LLMEngine, done, timeout: float) -> None:
    """Keep one long request decoding until ``done()``, for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    next_id = 100
    while not done():
        assert time.monotonic() < deadline, f"not true after {timeout} s; the engine is on {engine.runner.threads.n} threads"
        if not engine.has_work():
            next_id += 1
            engine.add(Submit(next_id, list(range(100, 140)), SamplingParams(max_tokens=512, temperature=0, ignore_eos=True)))
        list(engine.step())


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
