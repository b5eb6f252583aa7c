"""The scheduler's books on the KV streams, against a fake that holds each stream's tokens.

The fake carries out copy, swap, trim and clear in the order asked, as
llama.cpp does at the next decode, and every chunk a step decodes writes its
tokens at its positions. After every step each running sequence's stream
must hold exactly its known tokens so far, and each cache entry's stream
exactly its entry's tokens: a slot mixed up anywhere shows as a mismatch.
No model is involved; tests/test_prefix_cache.py checks the same on llama.cpp.
"""

from __future__ import annotations

import random

import numpy as np

from cllm.protocol import SamplingParams
from engine_proc.scheduler import Scheduler
from engine_proc.sequence import Sequence


class FakeStreams:
    def __init__(self, n: int):
        self.cells: list[list[int]] = [[] for _ in range(n + 1)]  # and the scratch stream, last
        self.scratch = n

    def copy(self, src: int, dst: int, keep: int) -> None:
        self.cells[dst] = self.cells[src][:keep]

    def swap(self, a: int, b: int) -> None:
        self.cells[a], self.cells[b] = self.cells[b], self.cells[a]

    def trim(self, slot: int, keep: int) -> None:
        del self.cells[slot][keep:]

    def clear(self, slot: int) -> None:
        self.cells[slot] = []


def run(sched: Scheduler, kv: FakeStreams, seqs: list[Sequence], rng: random.Random) -> None:
    """Step until every sequence is done, checking the books after every step."""
    for seq in seqs:
        sched.add(seq)
    while sched.has_work():
        step = sched.schedule()
        for chunk in [*step.decode, *step.prefill]:
            seq = chunk.seq
            assert kv.cells[seq.slot] == seq.known(chunk.start).tolist()
            kv.cells[seq.slot] += seq.known(chunk.end)[chunk.start :].tolist()
            seq.n_cached = chunk.end
        done = set()
        for seq in sched.running:  # as the engine samples: a token for every sequence past its known ones
            if not seq.prefilling and seq.n_cached == len(seq.prompt) + len(seq.output):
                seq.output.append(rng.randrange(1000, 2000))
                if len(seq.output) == seq.params.max_tokens:
                    done.add(seq.id)
        sched.remove(done)
        for seq in sched.running:
            assert kv.cells[seq.slot][: seq.n_cached] == seq.known(seq.n_cached).tolist()
        for slot, entry in sched.cache.entries.items():
            assert kv.cells[slot] == entry.tokens.tolist(), slot


def conversation_turns(rng: random.Random, conversations: int, turns: int) -> list[list[list[int]]]:
    system = [rng.randrange(100) for _ in range(40)]
    out = []
    for c in range(conversations):
        history = system + [500 + c]
        rounds = []
        for _ in range(turns):
            history = history + [rng.randrange(100) for _ in range(rng.randrange(3, 30))]
            rounds.append(history)
        out.append(rounds)
    return out


def test_books_stay_right_through_conversations_outnumbering_the_streams():
    rng = random.Random(1)
    parallel, slots = 3, 6
    kv = FakeStreams(slots)
    sched = Scheduler(parallel, slots, 64, 4096, kv, prefix_cache=True, exact=False)
    ids = iter(range(10**6))
    convs = conversation_turns(rng, 8, 5)
    for turn in range(5):
        batch = [Sequence(next(ids), np.array(c[turn], np.int32), SamplingParams(max_tokens=rng.randrange(1, 12)), None) for c in convs]
        rng.shuffle(batch)
        run(sched, kv, batch[:4], rng)
        run(sched, kv, batch[4:], rng)
    assert sched.cache.stats().hit_tokens > 0


def test_a_conversation_continued_reuses_its_reply():
    rng = random.Random(2)
    kv = FakeStreams(4)
    sched = Scheduler(2, 4, 64, 4096, kv, prefix_cache=True, exact=False)
    first = Sequence(1, np.arange(50, dtype=np.int32), SamplingParams(max_tokens=10), None)
    run(sched, kv, [first], rng)
    history = first.known(len(first.prompt) + len(first.output))
    before = sched.cache.stats().hit_tokens
    second = Sequence(2, np.concatenate((history, np.array([7, 8, 9], np.int32))), SamplingParams(max_tokens=3), None)
    run(sched, kv, [second], rng)
    # All the first one's cells: its prompt and its output but the last token, never fed back.
    assert sched.cache.stats().hit_tokens - before == len(history) - 1


def test_exact_mode_reuses_only_whole_prompt_blocks():
    rng = random.Random(3)
    kv = FakeStreams(2)
    sched = Scheduler(1, 2, 512, 4096, kv, prefix_cache=True, exact=True)
    run(sched, kv, [Sequence(1, np.arange(300, dtype=np.int32), SamplingParams(max_tokens=5), None)], rng)
    before = sched.cache.stats().hit_tokens
    run(sched, kv, [Sequence(2, np.arange(310, dtype=np.int32), SamplingParams(max_tokens=5), None)], rng)
    assert sched.cache.stats().hit_tokens - before == 256
