"""The scheduler's steps (admission, steady waves, prompt chunks) and the KV streams' books, against a fake
that holds each stream's tokens (the prefix cache's books: tests/unit/test_slots.py).

The fake keeps each stream as llama.cpp does: how many cells it says it
holds (changed at once by every call) and what those cells hold (between
streams on a device a copy or swap reaches them only at the next decode,
after the ones asked before it; between streams in host memory, and a host
RAM restore, at once). Every chunk a step decodes writes its tokens at
its positions. After every step each running sequence's stream must hold
exactly its known tokens so far, each cache entry's stream exactly its
entry's tokens, and each copy in host RAM its entry's tokens: a slot mixed
up anywhere, or a copy taken or restored out of turn, shows as a mismatch.
No model is involved; tests/test_prefix_cache.py checks the same on llama.cpp.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from cllm.core.protocol import SamplingParams
from engine_proc.scheduler import MAX_WAIT, Scheduler, SchedulerSettings
from engine_proc.sequence import ImageSpan, Sequence


class FakeStreams:
    def __init__(self, n: int, host: bool = False):
        self.n = [0] * (n + 1)  # cells each stream says it holds; the scratch stream last
        self.data: list[list[int]] = [[] for _ in range(n + 1)]  # what they hold
        self.scratch = n
        self.queued: list[tuple[int, int]] = []  # stream copies (src, dst) the next decode carries out
        self.moves_at_once = host  # streams in host memory: cells move at once, none through the scratch stream

    def copy(self, src: int, dst: int, keep: int) -> None:
        self.n[dst] = min(self.n[src], keep)
        if self.moves_at_once:
            self.data[dst] = list(self.data[src])
        else:
            self.queued.append((src, dst))

    def swap(self, a: int, b: int) -> None:
        self.n[a], self.n[b] = self.n[b], self.n[a]
        if self.moves_at_once:
            self.data[a], self.data[b] = self.data[b], self.data[a]
        else:
            self.queued += [(a, self.scratch), (b, a), (self.scratch, b)]

    def trim(self, slot: int, keep: int) -> None:
        self.n[slot] = min(self.n[slot], keep)

    def clear(self, slot: int) -> None:
        self.n[slot] = 0

    def settled(self, slot: int) -> bool:
        return all(slot not in pair for pair in self.queued)

    def save(self, slot: int) -> np.ndarray:
        assert self.settled(slot)
        return np.array(self.held(slot), np.int32)

    def restore(self, slot: int, data: np.ndarray) -> bool:
        assert self.settled(slot)
        self.data[slot], self.n[slot] = data.tolist(), len(data)
        return True

    def decode(self) -> None:
        for src, dst in self.queued:
            self.data[dst] = list(self.data[src])
        self.queued.clear()

    def held(self, slot: int) -> list[int]:
        return self.data[slot][: self.n[slot]]

    def write(self, slot: int, start: int, tokens: list[int]) -> None:
        assert self.n[slot] == start
        self.data[slot][start:] = tokens
        self.n[slot] = start + len(tokens)


def recorded(kv: FakeStreams, *names: str) -> list[str]:
    """The names of these methods of ``kv``, in the order they are called from now on."""
    moves: list[str] = []
    for name in names:
        method = getattr(kv, name)

        def record(*a, _m=method, _n=name):
            moves.append(_n)
            return _m(*a)

        setattr(kv, name, record)
    return moves


def run(sched: Scheduler, kv: FakeStreams, seqs: list[Sequence], rng: random.Random) -> None:
    """Step until every sequence is done, checking the books after every step."""
    for seq in seqs:
        sched.add(seq)
    while sched.has_work():
        step = sched.schedule()
        for seq in sched.recalled:  # served whole with an entry's logits: the engine picks their first token
            assert not seq.prefilling and seq.end_logits is not None and not seq.output
        sched.recalled.clear()
        kv.decode()
        for chunk in [*step.decode, *step.prefill]:
            seq = chunk.seq
            assert kv.held(seq.slot) == seq.known(chunk.start).tolist()
            kv.write(seq.slot, chunk.start, seq.known(chunk.end)[chunk.start :].tolist())
            seq.n_cached = chunk.end
        done = set()
        for seq in sched.running:  # as the engine samples: a token for every sequence past its known ones
            if not seq.prefilling and seq.n_cached == len(seq.prompt) + len(seq.output):
                if seq.keeps_logits and seq.end_logits is None:  # the prompt's logits row, as Recorder.record keeps
                    seq.end_logits = np.full(1, seq.id, np.float32)
                seq.append(rng.randrange(1000, 2000))
                if len(seq.output) == seq.params.max_tokens:
                    done.add(seq.id)
        sched.remove(done)
        for seq in sched.running:
            assert kv.held(seq.slot)[: seq.n_cached] == seq.known(seq.n_cached).tolist()
        assert sched.cache is not None
        for slot, entry in sched.cache.entries.items():
            assert kv.held(slot) == entry.tokens.tolist(), slot
        if sched.cache.host is not None:
            for stored in sched.cache.host.entries.values():
                assert stored.data is not None and stored.data.tolist() == stored.tokens.tolist()


def prefilled_by_step(sched: Scheduler, kv: FakeStreams, steps: int) -> list[list[int]]:
    """Step ``steps`` times, every sequence writing its chunks and sampling; the ids each step prefilled."""
    prefilled = []
    for _ in range(steps):
        step = sched.schedule()
        kv.decode()
        prefilled.append([c.seq.id for c in step.prefill])
        for chunk in [*step.decode, *step.prefill]:
            kv.write(chunk.seq.slot, chunk.start, chunk.seq.known(chunk.end)[chunk.start :].tolist())
            chunk.seq.n_cached = chunk.end
            if not chunk.seq.prefilling:
                chunk.seq.append(7)
    return prefilled


def test_a_step_starts_at_most_admit_per_step_new_requests():
    kv = FakeStreams(4)
    sched = Scheduler(SchedulerSettings(4, 4, 512, 4096, prefix_cache=True, exact=False, admit_per_step=1), kv)
    for i in range(3):
        sched.add(Sequence(i, np.arange(100 * i, 100 * i + 20, dtype=np.int32), SamplingParams(max_tokens=8), None))
    assert prefilled_by_step(sched, kv, 3) == [[0], [1], [2]]
    # A burst: one a step, then every request that has waited MAX_WAIT steps at once.
    burst = Scheduler(
        SchedulerSettings(8, 8, 512, 4096, prefix_cache=True, exact=False, admit_per_step=1), FakeStreams(8)
    )
    for i in range(8):
        burst.add(Sequence(i, np.arange(100 * i, 100 * i + 20, dtype=np.int32), SamplingParams(max_tokens=50), None))
    counts = []
    for _ in range(MAX_WAIT + 1):
        step = burst.schedule()
        counts.append(len(step.prefill))
        for chunk in step.prefill:
            chunk.seq.n_cached = chunk.end
    assert counts == [1] * MAX_WAIT + [8 - MAX_WAIT]
    unbounded = Scheduler(SchedulerSettings(4, 4, 512, 4096, prefix_cache=True, exact=False), FakeStreams(4))
    for i in range(3):
        unbounded.add(Sequence(i, np.arange(100 * i, 100 * i + 20, dtype=np.int32), SamplingParams(max_tokens=8), None))
    assert [c.seq.id for c in unbounded.schedule().prefill] == [0, 1, 2]


def test_a_step_starts_one_request_that_continues_a_cache_entry():
    """Chat turns that arrive together start a step apart, so the conversations drift apart; others do not wait."""
    rng = random.Random(3)
    kv = FakeStreams(16)
    sched = Scheduler(SchedulerSettings(8, 16, 512, 4096, prefix_cache=True, exact=False), kv)
    firsts = [
        Sequence(i, np.arange(100 * i, 100 * i + 40, dtype=np.int32), SamplingParams(max_tokens=5), None)
        for i in range(6)
    ]
    run(sched, kv, firsts, rng)
    turns = [
        Sequence(
            10 + i,
            np.concatenate((s.known(45), np.arange(900, 910, dtype=np.int32))),
            SamplingParams(max_tokens=50),
            None,
        )
        for i, s in enumerate(firsts)
    ]
    # Shares 30 tokens of an entry it does not extend (a system prompt, say), and a prompt shared with nothing.
    sharer = Sequence(
        20,
        np.concatenate((firsts[5].prompt[:30], np.arange(3000, 3010, dtype=np.int32))),
        SamplingParams(max_tokens=50),
        None,
    )
    fresh = Sequence(21, np.arange(2000, 2030, dtype=np.int32), SamplingParams(max_tokens=50), None)
    for seq in [turns[0], sharer, fresh, *turns[1:]]:
        sched.add(seq)
    # One continuation a step (the others beside one), then all that waited MAX_WAIT steps.
    assert prefilled_by_step(sched, kv, MAX_WAIT + 1) == [[10], [20, 21, 11], [12], [13], [14, 15]]
    assert all(s.reused == 44 for s in turns)  # the first turn's cells: all but its last token's, never decoded
    assert sharer.reused == 30


def test_running_sequences_stay_in_one_run_of_slots_moving_as_few_streams_as_it_takes():
    """Departures that leave the decoding sequences in consecutive slots move no stream (where the run starts
    does not matter to llama.cpp), a new request takes the slot next to them, and a gap inside the run is
    closed by the fewest moves: a move copies a stream's cells through host memory, twice with an entry in
    the way."""
    kv = FakeStreams(8)
    sched = Scheduler(SchedulerSettings(8, 8, 512, 4096, prefix_cache=True, exact=False), kv)
    moves = recorded(kv, "copy", "swap")

    def seq(i):
        return Sequence(i, np.arange(100 * i, 100 * i + 10, dtype=np.int32), SamplingParams(max_tokens=50), None)

    def decode_slots():
        prefilled_by_step(sched, kv, 1)
        for s in sched.running:
            assert kv.held(s.slot)[: s.n_cached] == s.known(s.n_cached).tolist()
        for slot, entry in sched.cache.entries.items():
            assert kv.held(slot) == entry.tokens.tolist(), slot
        return [c.seq.slot for c in sched.decode_batch()]

    for i in range(6):
        sched.add(seq(i))
    prefilled_by_step(sched, kv, 1)
    assert decode_slots() == [0, 1, 2, 3, 4, 5]
    sched.remove({0, 1})  # their cells stay as entries in slots 0 and 1
    assert decode_slots() == [2, 3, 4, 5] and moves == []
    sched.add(seq(6))
    assert decode_slots() == [1, 2, 3, 4, 5]  # the new one just below the run
    assert moves == ["copy"] and 1 not in sched.cache.entries  # the entry in its way moved to a free slot
    moves.clear()
    sched.remove({3})
    assert decode_slots() == [1, 2, 3, 4] and moves == ["swap"]  # slot 5's moved into 3, which kept an entry


def _steady_run(sched: Scheduler, kv: FakeStreams, seqs: list[Sequence], clients: int, rng: random.Random):
    """Every sequence through steady steps, ``clients`` at a time (closed loop), each step's decode then its
    prompt chunks written as llama.cpp would; the books checked after every step. Each step's decode batch (its
    slots) and the tokens of its prompt chunks that share a llama_decode (engine_proc/run/prefill_runs.py)."""
    pending, outputs, shapes, shared = list(seqs), {s.id: 0 for s in seqs}, [], []
    while pending or sched.has_work():
        while pending and len(sched.waiting) + len(sched.running) - sched.parked < clients:
            sched.add(pending.pop(0))
        step = sched.schedule()
        kv.decode()
        shapes.append(tuple(c.seq.slot for c in step.decode))
        # One run of slots: one graph (gaps are for waiting requests to fill, and prompts still prefilling).
        if shapes[-1] and not sched.waiting and not any(s.prefilling for s in sched.running):
            assert shapes[-1] == tuple(range(shapes[-1][0], shapes[-1][0] + len(shapes[-1]))), shapes[-1]
        for chunk in step.decode:  # the decode runs first; a parked sequence's row is written and ignored
            seq = chunk.seq
            assert kv.held(seq.slot) == seq.known(chunk.start).tolist()
            kv.write(seq.slot, chunk.start, [seq.output[-1]])
            if seq.parked:
                continue
            seq.n_cached = chunk.end
            seq.append(rng.randrange(1000, 2000))
            outputs[seq.id] += 1
            if len(seq.output) == seq.params.max_tokens:
                sched.park(seq)
        sched.wave(step)  # then the wave's admissions, beside the step's other prompt chunks
        shared.append(sum(c.end - c.start for c in step.prefill))
        kv.decode()
        for chunk in step.prefill:
            seq = chunk.seq
            kv.write(seq.slot, chunk.start, seq.known(chunk.end)[chunk.start :].tolist())
            seq.n_cached = chunk.end
            if not seq.prefilling:
                seq.append(rng.randrange(1000, 2000))
                outputs[seq.id] += 1
        for seq in sched.running:
            assert kv.held(seq.slot)[: seq.n_cached] == seq.known(seq.n_cached).tolist()
    assert all(outputs[s.id] == s.params.max_tokens for s in seqs)  # a parked sequence gives nothing more
    assert sched.parked == 0
    return shapes, shared


def _steady(seed, parallel, n, prompt, gen):
    """``n`` requests of random prompt and output lengths (in those ranges) through steady steps, ``parallel`` at
    a time, a step's budget 256 tokens (_steady_run)."""
    rng = random.Random(seed)
    kv = FakeStreams(parallel + 4)
    sched = Scheduler(SchedulerSettings(parallel, parallel + 4, 256, 4096, prefix_cache=True, exact=False), kv)
    sched.steady = True
    seqs = [
        Sequence(
            i,
            np.array([rng.randrange(100) for _ in range(rng.randrange(*prompt))], np.int32),
            SamplingParams(max_tokens=rng.randrange(*gen)),
            None,
        )
        for i in range(n)
    ]
    return _steady_run(sched, kv, seqs, parallel, rng)


def test_steady_steps_change_the_decode_batch_only_in_waves_and_keep_the_books():
    shapes, _ = _steady(7, 16, 64, (5, 30), (10, 40))
    full = [(a, b) for a, b in zip(shapes, shapes[1:]) if len(a) >= 8 and a and b]
    changed = sum(a != b for a, b in full)
    assert changed * 5 < len(full), (changed, len(full))  # decoding together changes shape in waves, not every step


def test_a_waves_prompts_fit_the_budget_beside_the_steps_own():
    """A burst of prompts longer than the budget (copy tasks at c = 8 on a GPU): the wave admits in what the step's
    own prompt chunks left, so the llama_decode they share never holds more than the budget (it overflowed the
    batch, and the engine died, when the wave took a whole budget of its own)."""
    _, shared = _steady(3, 8, 16, (300, 700), (10, 30))
    assert max(shared) == 256, shared  # full steps, and none over


@pytest.mark.parametrize("exact", [False, True], ids=["cache", "exact"])
def test_an_images_positions_are_decoded_apart_in_pieces_and_reused_whole(exact):
    """An image's rows: chunks of their own within the budget, each its sequence's last of a step (text after it
    waits a step); a cached prefix is reused up to an image's edge only, so another image never matches."""
    kv = FakeStreams(4)
    sched = Scheduler(
        SchedulerSettings(2, 4, 16, 512, prefix_cache=True, exact=exact), kv
    )  # blocks of 16 in exact mode

    def with_image(first_id, seq_id):
        prompt = np.concatenate((np.arange(10), np.arange(first_id, first_id + 40), np.arange(20, 50))).astype(np.int32)
        rows = np.zeros((40, 2), np.float32)
        return Sequence(seq_id, prompt, SamplingParams(max_tokens=2), None, images=[ImageSpan(10, 50, rows)])

    first = with_image(5000, 1)
    sched.add(first)
    pieces = []
    while first.prefilling:
        step = sched.schedule()
        kv.decode()
        for c in step.prefill:
            pieces.append((c.start, c.end, c.image is not None))
            kv.write(c.seq.slot, c.start, c.seq.known(c.end)[c.start :].tolist())
            c.seq.n_cached = c.end
        assert all(c.image is None for c in step.prefill[:-1])  # an image's chunk ends its sequence's step
    assert [p[:2] for p in pieces] == sorted(p[:2] for p in pieces) and pieces[0][0] == 0 and pieces[-1][1] == 80
    for start, end, image in pieces:
        assert image == (10 <= start < 50) and (end <= 10 or start >= 10) and (end <= 50 or start >= 50)
    assert max(e - s for s, e, image in pieces if image) <= 16  # within the step's budget
    first.append(7)
    first.n_cached += 1
    sched.remove({1})  # its cells stay, a cache entry
    same, other = with_image(5000, 2), with_image(5000, 3)
    other.prompt[40:50] += 1000  # the same first 30 of the image's placeholders, then another image's
    other.tokens[40:50] += 1000
    # exact mode reuses whole blocks: up to 64 here, past the image's end
    for seq, reused in ((other, 10), (same, 64 if exact else 79)):
        sched.add(seq)
        sched.schedule()
        assert seq.reused == reused
        sched.remove({seq.id})
