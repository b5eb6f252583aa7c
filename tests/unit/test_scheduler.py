"""The scheduler's books on the KV streams, against a fake that holds each stream's tokens.

The fake keeps each stream as llama.cpp does: how many cells it says it
holds (changed at once by every call) and what those cells hold (a copy or
swap reaches them only at the next decode, after the ones asked before it;
a host RAM restore at once). Every chunk a step decodes writes its tokens at
its positions. After every step each running sequence's stream must hold
exactly its known tokens so far, each cache entry's stream exactly its
entry's tokens, and each copy in host RAM its entry's tokens: a slot mixed
up anywhere, or a copy taken or restored out of turn, shows as a mismatch.
No model is involved; tests/test_prefix_cache.py checks the same on llama.cpp.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from cllm.core.protocol import SamplingParams
from engine_proc import host_cache
from engine_proc.disk_cache import DiskCache
from engine_proc.host_cache import HEAD, MIN_CELLS, HostCache
from engine_proc.scheduler import MAX_WAIT, Scheduler
from engine_proc.sequence import ImageSpan, Sequence, common_prefix, starts_with


class FakeStreams:
    def __init__(self, n: int, host: bool = False):
        self.n = [0] * (n + 1)  # cells each stream says it holds; the scratch stream last
        self.data: list[list[int]] = [[] for _ in range(n + 1)]  # what they hold
        self.scratch = n
        self.queued: list[tuple[int, int]] = []  # stream copies (src, dst) the next decode carries out
        self.host = host  # streams in host memory: cells can move between settled ones at once

    def copy(self, src: int, dst: int, keep: int, at_once: bool = False) -> None:
        self.n[dst] = min(self.n[src], keep)
        if at_once:
            assert self.can_move_at_once((src, dst))
            self.data[dst] = list(self.data[src])
        else:
            self.queued.append((src, dst))

    def can_move_at_once(self, slots) -> bool:
        return self.host and all(map(self.settled, slots))

    def swap(self, a: int, b: int) -> None:
        self.n[a], self.n[b] = self.n[b], self.n[a]
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
        kv.decode()
        for chunk in [*step.decode, *step.prefill]:
            seq = chunk.seq
            assert kv.held(seq.slot) == seq.known(chunk.start).tolist()
            kv.write(seq.slot, chunk.start, seq.known(chunk.end)[chunk.start :].tolist())
            seq.n_cached = chunk.end
        done = set()
        for seq in sched.running:  # as the engine samples: a token for every sequence past its known ones
            if not seq.prefilling and seq.n_cached == len(seq.prompt) + len(seq.output):
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


@pytest.mark.parametrize("host_streams", [False, True], ids=["device-streams", "host-streams"])
@pytest.mark.parametrize("host_bytes", [0, 4 * 300, 1 << 20], ids=["no-host-ram", "little-host-ram", "host-ram"])
def test_books_stay_right_through_conversations_outnumbering_the_streams(host_bytes, host_streams, monkeypatch):
    monkeypatch.setattr(host_cache, "MIN_CELLS", HEAD)  # these conversations are short
    rng = random.Random(1)
    parallel, slots = 3, 6
    kv = FakeStreams(slots, host_streams)
    sched = Scheduler(parallel, slots, 64, 4096, kv, prefix_cache=True, exact=False, host_bytes=host_bytes)
    ids = iter(range(10**6))
    convs = conversation_turns(rng, 8, 5)
    for turn in range(5):
        batch = [
            Sequence(next(ids), np.array(c[turn], np.int32), SamplingParams(max_tokens=rng.randrange(1, 12)), None)
            for c in convs
        ]
        rng.shuffle(batch)
        run(sched, kv, batch[:4], rng)
        run(sched, kv, batch[4:], rng)
    assert sched.cache.stats().hit_tokens > 0
    assert (sched.cache.stats().restored > 0) == (host_bytes > 0)


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


def test_a_prompt_asked_again_with_the_same_reply_moves_no_cells():
    """Greedy asks of one prompt leave the same tokens behind: the third on, the entry in the slot
    the request takes serves it in place, and the one it displaces is let go, held by another."""
    kv = FakeStreams(4)
    sched = Scheduler(2, 4, 64, 4096, kv, prefix_cache=True, exact=False)
    moves = recorded(kv, "copy", "swap", "save", "restore")
    prompt = np.arange(50, dtype=np.int32)
    for i in range(4):
        moves.clear()
        run(sched, kv, [Sequence(i, prompt, SamplingParams(max_tokens=10), None)], random.Random(5))  # the same reply
        assert sched.cache.stats().hit_tokens == 49 * i
        assert moves == ([] if i != 1 else ["copy"])  # the second keeps the first's reply: it was the only one
    assert len(sched.cache.entries) == 2


def test_exact_mode_reuses_only_whole_prompt_blocks():
    rng = random.Random(3)
    kv = FakeStreams(2)
    sched = Scheduler(1, 2, 512, 4096, kv, prefix_cache=True, exact=True)
    run(sched, kv, [Sequence(1, np.arange(300, dtype=np.int32), SamplingParams(max_tokens=5), None)], rng)
    before = sched.cache.stats().hit_tokens
    run(sched, kv, [Sequence(2, np.arange(310, dtype=np.int32), SamplingParams(max_tokens=5), None)], rng)
    assert sched.cache.stats().hit_tokens - before == 256


@pytest.mark.parametrize(
    "host_bytes, min_cells",
    [(0, HEAD), (1 << 20, HEAD), (1 << 20, MIN_CELLS)],
    ids=["no-host-ram", "host-ram", "host-ram-too-short"],
)
def test_conversations_outnumbering_every_stream_keep_their_turns_in_host_ram(host_bytes, min_cells, monkeypatch):
    """Six conversations take turns on three streams: with host RAM each turn reuses all of the previous one,
    unless their turns (40-60 cells) are too short for it: then nothing is even copied out."""
    monkeypatch.setattr(host_cache, "MIN_CELLS", min_cells)
    rng = random.Random(4)
    kv = FakeStreams(3)
    sched = Scheduler(2, 3, 64, 4096, kv, prefix_cache=True, exact=False, host_bytes=host_bytes)
    saves = []
    kv.save = lambda slot, save=kv.save: saves.append(slot) or save(slot)
    history = [np.array([rng.randrange(100) for _ in range(40)], np.int32) for _ in range(6)]
    ids = iter(range(10**6))
    full = 0  # later turns that reused all the previous turn's cells
    for turn in range(3):
        for c in range(6):
            prompt = np.concatenate((history[c], np.array([rng.randrange(100) for _ in range(5)], np.int32)))
            seq = Sequence(next(ids), prompt, SamplingParams(max_tokens=4), None)
            before = sched.cache.stats().hit_tokens
            run(sched, kv, [seq], rng)
            full += turn > 0 and sched.cache.stats().hit_tokens - before == len(history[c]) - 1
            history[c] = seq.known(len(seq.prompt) + len(seq.output))
    stats = sched.cache.stats()
    if host_bytes and min_cells == HEAD:
        assert full == 12 and stats.restored >= 12 - 3
        assert 0 < stats.host_bytes <= host_bytes and stats.host_cells > 0
    else:
        assert full <= 3 and stats.restored == 0  # only what the three streams held
        assert stats.host_cells == 0 and not saves


@pytest.mark.parametrize("host_streams", [False, True], ids=["device-streams", "host-streams"])
def test_an_entry_back_from_host_ram_lands_in_its_sequences_slot_when_streams_move_at_once(host_streams, monkeypatch):
    """A conversation's turn whose cells come back from host RAM (or a file, after a restart): with streams in
    host memory they are restored into the slot the sequence takes, whose short entry moves aside first, so
    nothing trades places; streams on a device go to a free stream and trade places through the scratch one."""
    monkeypatch.setattr(host_cache, "MIN_CELLS", HEAD)
    rng = random.Random(7)
    kv = FakeStreams(2, host_streams)
    sched = Scheduler(1, 2, 64, 4096, kv, prefix_cache=True, exact=False, host_bytes=1 << 20)
    ids = iter(range(10**6))
    first, *others = [
        Sequence(next(ids), np.arange(300, dtype=np.int32) + 1000 * c, SamplingParams(max_tokens=4), None)
        for c in range(3)
    ]
    for seq in (first, *others):  # the two others push the first one's entry out of the streams, into host RAM
        run(sched, kv, [seq], rng)
    assert [e.tokens[0] for e in sched.cache.host.entries.values()] == [0]
    moves = recorded(kv, "copy", "swap", "restore")
    history = first.known(len(first.prompt) + len(first.output))
    turn = Sequence(
        next(ids), np.concatenate((history, np.array([7, 8, 9], np.int32))), SamplingParams(max_tokens=3), None
    )
    before = sched.cache.stats().hit_tokens
    run(sched, kv, [turn], rng)
    assert sched.cache.stats().hit_tokens - before == len(history) - 1 and sched.cache.stats().restored == 1
    assert moves == (["copy", "restore"] if host_streams else ["restore", "swap"])


class TokenFiles(FakeStreams):
    """Streams whose saved cells are their tokens' bytes, as a file of the disk cache holds them."""

    def save(self, slot: int) -> np.ndarray:
        return super().save(slot).view(np.uint8)

    def restore(self, slot: int, data: np.ndarray) -> bool:
        return super().restore(slot, np.frombuffer(data, np.int32))


def three_files(tmp_path, ident: dict) -> list[np.ndarray]:
    """Three conversations' files, the first the oldest."""
    disk = DiskCache(str(tmp_path), 1 << 30, ident)
    convs = [np.arange(300, dtype=np.int32) + 1000 * c for c in range(3)]
    for tokens in convs:
        disk.put(tokens, tokens.view(np.uint8))
    disk.close()
    for age, tokens in enumerate(convs):  # their last uses
        path = os.path.join(disk.dir, next(e.name for e in disk.entries.values() if e.tokens[0] == tokens[0]))
        os.utime(path, ns=(age * 10**9, age * 10**9))
    return convs


def test_a_new_engine_warms_the_newest_files_into_its_highest_empty_device_streams_before_its_first_step(tmp_path):
    """Three conversations on disk, two streams: the two newest files go into slots 1 and 0, the oldest is
    read when its turn comes; a scheduler that has stepped warms nothing, and its files still serve."""
    rng = random.Random(8)
    ident = {"model": "fake"}
    convs = three_files(tmp_path, ident)
    kv = TokenFiles(2)
    sched = Scheduler(2, 2, 64, 4096, kv, prefix_cache=True, exact=False, disk=DiskCache(str(tmp_path), 1 << 30, ident))
    assert sched.warm() and sched.warm() and not sched.warm()
    assert {slot: int(e.tokens[0]) for slot, e in sched.cache.entries.items()} == {1: 2000, 0: 1000}
    assert kv.held(1) == convs[2].tolist() and kv.held(0) == convs[1].tolist()
    assert sched.cache.persist_wait() is None  # nothing left to warm: the idle engine sleeps
    ids = iter(range(10**6))
    for conv in (convs[0], convs[2]):  # the oldest from its file, the newest from its warmed stream
        turn = Sequence(
            next(ids), np.concatenate((conv, np.array([7, 8, 9], np.int32))), SamplingParams(max_tokens=2), None
        )
        run(sched, kv, [turn], rng)
    stats = sched.cache.stats()
    assert stats.hit_tokens == 2 * 300 and stats.disk_hits == 2

    # Warmed streams no prompt reuses make way for others without a copy to host RAM: their files hold them.
    fresh = Scheduler(
        2,
        2,
        64,
        4096,
        TokenFiles(2),
        prefix_cache=True,
        exact=False,
        host_bytes=1 << 30,
        disk=DiskCache(str(tmp_path), 1 << 30, ident),
    )
    while fresh.warm():
        pass
    others = [
        Sequence(next(ids), np.arange(200, dtype=np.int32) + 5000 * (k + 1), SamplingParams(max_tokens=2), None)
        for k in range(2)
    ]
    run(fresh, fresh.kv, others, rng)
    assert not any(e.warmed for e in fresh.cache.entries.values()) and fresh.cache.host.bytes == 0

    later = Scheduler(
        2, 2, 64, 4096, TokenFiles(2), prefix_cache=True, exact=False, disk=DiskCache(str(tmp_path), 1 << 30, ident)
    )
    run(later, later.kv, [Sequence(next(ids), np.arange(5, dtype=np.int32), SamplingParams(max_tokens=1), None)], rng)
    assert not later.warm() and not any(e.warmed for e in later.cache.entries.values())
    assert later.cache.persist_wait() is None and later.cache.disk.entries


def test_with_streams_in_host_memory_files_are_read_into_the_stream_each_turn_takes_not_warmed(tmp_path):
    """A warmed stream would trade places with the one its conversation's sequence takes, on the CPU a save and
    a restore of each; the file's cells are restored straight into that stream instead."""
    rng = random.Random(9)
    ident = {"model": "fake"}
    convs = three_files(tmp_path, ident)
    kv = TokenFiles(2, host=True)
    sched = Scheduler(2, 2, 64, 4096, kv, prefix_cache=True, exact=False, disk=DiskCache(str(tmp_path), 1 << 30, ident))
    assert not sched.warm() and not sched.cache.entries
    assert sched.cache.persist_wait() is None  # nothing to warm: the idle engine sleeps
    moves = recorded(kv, "copy", "swap", "restore")
    for k, conv in enumerate((convs[2], convs[0])):
        turn = Sequence(k, np.concatenate((conv, np.array([7, 8, 9], np.int32))), SamplingParams(max_tokens=2), None)
        run(sched, kv, [turn], rng)
    assert moves == ["restore", "copy", "restore"]  # the first turn's entry moves out of slot 0 for the second
    stats = sched.cache.stats()
    assert stats.hit_tokens == 2 * 300 and stats.disk_hits == 2


def test_a_short_entry_goes_to_host_ram_rather_than_pushing_a_longer_one_there(monkeypatch):
    """Streams full of long conversations, then one-off short prompts: each short entry displaced is
    copied out itself, not the least recently used long one (both are kept either way)."""
    monkeypatch.setattr(host_cache, "MIN_CELLS", HEAD)
    rng = random.Random(6)
    kv = FakeStreams(3)
    sched = Scheduler(1, 3, 64, 4096, kv, prefix_cache=True, exact=False, host_bytes=1 << 20)
    saved = []  # cells of each copy out

    def save(slot: int, _save=kv.save) -> np.ndarray:
        data = _save(slot)
        saved.append(len(data))
        return data

    kv.save = save
    ids = iter(range(10**6))
    for c in range(3):
        run(
            sched,
            kv,
            [Sequence(next(ids), np.arange(200, dtype=np.int32) + 1000 * c, SamplingParams(max_tokens=4), None)],
            rng,
        )
    for c in range(4):
        run(
            sched,
            kv,
            [Sequence(next(ids), np.arange(40, dtype=np.int32) + 5000 + 100 * c, SamplingParams(max_tokens=4), None)],
            rng,
        )
    # The first short prompt displaces the newest long entry (it is worth more than the oldest): the oldest
    # goes out. Each later one displaces its short predecessor, which goes out in its stead.
    assert saved == [203] + [43] * 3
    assert sorted(len(e.tokens) for e in sched.cache.entries.values()) == [43, 203, 203]
    assert sched.cache.stats().host_cells == 203 + 43 * 3


def test_host_ram_keeps_what_adds_cells_and_stays_within_its_bytes(monkeypatch):
    monkeypatch.setattr(host_cache, "MIN_CELLS", HEAD)
    head = np.arange(HEAD, dtype=np.int32)
    host = HostCache(max_bytes=4 * (2 * HEAD + 10))

    def held() -> list[list[int]]:
        return [e.tokens.tolist() for e in host.entries.values()]

    a = np.concatenate((head, [1, 2]))
    host.put(a, a.copy())
    host.put(a[:-1], a[:-1].copy())  # a prefix of what it holds: nothing new
    host.put(head[:-1], head[:-1].copy())  # too short to keep
    assert held() == [a.tolist()]
    b = np.concatenate((a, [3, 4]))
    host.put(b, b.copy())  # holds all of a's cells: a goes
    assert held() == [b.tolist()]
    c = np.concatenate((head[::-1], [5, 6, 7, 8]))
    host.put(c, c.copy())  # 72 tokens of 4 bytes, past the budget: the oldest goes
    assert held() == [c.tolist()] and host.bytes == c.nbytes
    stored, n = host.lookup(np.concatenate((c[:-2], [0])), longest=HEAD + 1, unit=1)
    assert stored is not None and n == HEAD + 1
    assert host.lookup(b, longest=len(b), unit=1) == (None, 0)  # gone
    assert host.lookup(c[: HEAD - 1], longest=HEAD - 1, unit=1) == (None, 0)  # shorter than the head


def test_host_ram_keeps_no_entry_shorter_than_its_minimum():
    """A short entry (a one-off request's, most often) is not worth its copy's fresh pages."""
    host = HostCache(max_bytes=1 << 20)
    assert MIN_CELLS > HEAD
    short, enough = np.arange(MIN_CELLS - 1, dtype=np.int32), np.arange(1000, 1000 + MIN_CELLS, dtype=np.int32)
    assert not host.wants(short) and host.wants(enough)
    host.put(short, short.copy())
    host.put(enough, enough.copy())
    assert [e.tokens.tolist() for e in host.entries.values()] == [enough.tolist()]


def test_a_step_starts_at_most_admit_per_step_new_requests():
    kv = FakeStreams(4)
    sched = Scheduler(4, 4, 512, 4096, kv, prefix_cache=True, exact=False, admit_per_step=1)
    for i in range(3):
        sched.add(Sequence(i, np.arange(100 * i, 100 * i + 20, dtype=np.int32), SamplingParams(max_tokens=8), None))
    assert prefilled_by_step(sched, kv, 3) == [[0], [1], [2]]
    # A burst: one a step, then every request that has waited MAX_WAIT steps at once.
    burst = Scheduler(8, 8, 512, 4096, FakeStreams(8), prefix_cache=True, exact=False, admit_per_step=1)
    for i in range(8):
        burst.add(Sequence(i, np.arange(100 * i, 100 * i + 20, dtype=np.int32), SamplingParams(max_tokens=50), None))
    counts = []
    for _ in range(MAX_WAIT + 1):
        step = burst.schedule()
        counts.append(len(step.prefill))
        for chunk in step.prefill:
            chunk.seq.n_cached = chunk.end
    assert counts == [1] * MAX_WAIT + [8 - MAX_WAIT]
    unbounded = Scheduler(4, 4, 512, 4096, FakeStreams(4), prefix_cache=True, exact=False)
    for i in range(3):
        unbounded.add(Sequence(i, np.arange(100 * i, 100 * i + 20, dtype=np.int32), SamplingParams(max_tokens=8), None))
    assert [c.seq.id for c in unbounded.schedule().prefill] == [0, 1, 2]


def test_a_step_starts_one_request_that_continues_a_cache_entry():
    """Chat turns that arrive together start a step apart, so the conversations drift apart; others do not wait."""
    rng = random.Random(3)
    kv = FakeStreams(16)
    sched = Scheduler(8, 16, 512, 4096, kv, prefix_cache=True, exact=False)
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


def test_common_prefix_and_starts_with():
    a = np.array([1, 2, 3, 4], np.int32)
    assert common_prefix(a, np.array([1, 2, 9], np.int32)) == 2
    assert common_prefix(a, a[:0]) == 0
    assert starts_with(a, a[:3]) and starts_with(a, a[:0]) and starts_with(a, a)
    assert not starts_with(a[:3], a)  # longer than the array
    assert not starts_with(a, np.array([1, 9, 3], np.int32))  # its last token agrees, an earlier one does not
    assert not starts_with(a, np.array([1, 2, 9], np.int32))


def test_prefix_lengths_and_held_match_the_plain_comparisons():
    """The vector forms the cache searches with give what common_prefix and starts_with give, one array at a time."""
    from engine_proc.prefix_cache import PROBE, Held, heads_of, prefix_lengths

    rng = np.random.default_rng(0)
    base = rng.integers(0, 50, 3 * PROBE).astype(np.int32)
    arrays = [base[:n].copy() for n in (0, 1, PROBE - 1, PROBE, PROBE + 1, 3 * PROBE)]
    for n in (2, PROBE - 3, PROBE + 5):  # diverging before, at and after the probed head
        other = base.copy()
        other[n] += 1
        arrays.append(other)
    arrays += [rng.integers(0, 50, int(rng.integers(1, 4 * PROBE))).astype(np.int32) for _ in range(20)]
    prompts = [base, base[:3], base[: PROBE + 2], arrays[-1], np.zeros(0, np.int32), *arrays[6:9]]
    for prompt in prompts:
        got = prefix_lengths(prompt, heads_of(arrays), arrays).tolist()
        assert got == [common_prefix(prompt, a) for a in arrays]
    held = Held({slot: a for slot, a in enumerate(arrays[:4])})
    held.add(10, arrays[4])
    for prefix in prompts + arrays:
        assert held.holds(prefix) == any(starts_with(a, prefix) for a in arrays[:5]), prefix
    assert [(slot, n) for slot, _, n in held.prefixes(base)] == [
        (0, 0),
        (1, 1),
        (2, PROBE - 1),
        (3, PROBE),
        (10, PROBE + 1),
    ]
    assert not Held({}).holds(base[:1])


def test_steady_steps_change_the_decode_batch_only_in_waves_and_keep_the_books():
    rng = random.Random(7)
    kv = FakeStreams(20)
    sched = Scheduler(16, 20, 256, 4096, kv, prefix_cache=True, exact=False)
    sched.steady = True
    seqs = [
        Sequence(
            i,
            np.array([rng.randrange(100) for _ in range(rng.randrange(5, 30))], np.int32),
            SamplingParams(max_tokens=rng.randrange(10, 40)),
            None,
        )
        for i in range(64)
    ]
    pending, outputs, shapes = list(seqs), {s.id: 0 for s in seqs}, []
    while pending or sched.has_work():
        while pending and len(sched.waiting) + len(sched.running) - sched.parked < 16:  # closed-loop clients
            sched.add(pending.pop(0))
        step = sched.schedule()
        kv.decode()
        shapes.append(tuple(c.seq.slot for c in step.decode))
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
        prefill = step.prefill + sched.wave()  # then the wave's admissions, in llama_decode calls of their own
        kv.decode()
        for chunk in prefill:
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
    full = [(a, b) for a, b in zip(shapes, shapes[1:]) if len(a) >= 8 and a and b]
    changed = sum(a != b for a, b in full)
    assert changed * 5 < len(full), (changed, len(full))  # decoding together changes shape in waves, not every step


@pytest.mark.parametrize("exact", [False, True], ids=["cache", "exact"])
def test_an_images_positions_are_decoded_apart_in_pieces_and_reused_whole(exact):
    """An image's rows: chunks of their own within the budget, each its sequence's last of a step (text after it
    waits a step); a cached prefix is reused up to an image's edge only, so another image never matches."""
    kv = FakeStreams(4)
    sched = Scheduler(2, 4, 16, 512, kv, prefix_cache=True, exact=exact)  # blocks of 16 in exact mode

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
