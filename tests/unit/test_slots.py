"""The KV streams' books (engine_proc/kv/slots.py) and the prefix cache's searches, against the fake streams of
tests/unit/test_scheduler.py: each stream's tokens, copies carried out at the next decode, host RAM restores at
once. After every step each running sequence's stream must hold exactly its known tokens so far, each cache
entry's stream exactly its entry's tokens, and each copy in host RAM its entry's tokens. No model is involved;
tests/test_prefix_cache.py checks the same on llama.cpp.
"""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from cllm.core.protocol import SamplingParams
from engine_proc.kv import host_cache
from engine_proc.kv.disk_cache import DiskCache
from engine_proc.kv.host_cache import HEAD, MIN_CELLS, HostCache
from engine_proc.scheduler import Scheduler, SchedulerSettings
from engine_proc.sequence import Sequence, common_prefix, starts_with
from tests.unit.test_scheduler import FakeStreams, recorded, run


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
    sched = Scheduler(
        SchedulerSettings(parallel, slots, 64, 4096, prefix_cache=True, exact=False, host_bytes=host_bytes), kv
    )
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
    sched = Scheduler(SchedulerSettings(2, 4, 64, 4096, prefix_cache=True, exact=False), kv)
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
    sched = Scheduler(SchedulerSettings(2, 4, 64, 4096, prefix_cache=True, exact=False), kv)
    moves = recorded(kv, "copy", "swap", "save", "restore")
    prompt = np.arange(50, dtype=np.int32)
    for i in range(4):
        moves.clear()
        run(sched, kv, [Sequence(i, prompt, SamplingParams(max_tokens=10), None)], random.Random(5))  # the same reply
        assert sched.cache.stats().hit_tokens == 49 * i
        assert moves == ([] if i != 1 else ["copy"])  # the second keeps the first's reply: it was the only one
    assert len(sched.cache.entries) == 2


@pytest.mark.parametrize("host_bytes", [0, 1 << 20], ids=["no-host-ram", "host-ram"])
def test_a_prompt_asked_again_is_served_whole_where_its_entry_kept_logits(host_bytes, monkeypatch):
    """Sequences that keep their prompt's logits leave them with their entry, in its stream or in host RAM; the
    same prompt asked again then reuses every cell and takes those logits (Scheduler.recalled). One that does
    not keep them (logprobs, a llama.cpp chain) prefills the last token again."""
    monkeypatch.setattr(host_cache, "MIN_CELLS", HEAD)
    rng = random.Random(4)
    kv = FakeStreams(3)
    sched = Scheduler(SchedulerSettings(2, 3, 64, 4096, prefix_cache=True, exact=False, host_bytes=host_bytes), kv)
    prompts = [np.array([p] + [rng.randrange(100) for _ in range(59)], np.int32) for p in range(4)]
    ids = iter(range(10**6))

    def ask(prompt, keeps=True):
        seq = Sequence(next(ids), prompt, SamplingParams(max_tokens=3), None, keeps_logits=keeps)
        run(sched, kv, [seq], rng)
        return seq

    first = [ask(p) for p in prompts]
    again = [ask(p) for p in reversed(prompts)]  # the latest first: its entry is still in a stream
    # Whole or nothing: entries pushed out of the streams went to host RAM, or are gone without it.
    reused = [s.reused for s in again]
    assert set(reused) <= {0, 60} and (reused == [60] * 4 if host_bytes else reused[:2] == [60, 60])
    served = [(s, f) for s, f in zip(again, reversed(first)) if s.reused]
    assert all(s.end_logits is not None and s.end_logits[0] == f.id for s, f in served)  # the first ask's own row
    plain = ask(prompts[0], keeps=False)  # the last asked: its entry is in a stream
    assert plain.reused == len(prompts[0]) - 1 and plain.end_logits is None


def test_exact_mode_reuses_only_whole_prompt_blocks():
    rng = random.Random(3)
    kv = FakeStreams(2)
    sched = Scheduler(SchedulerSettings(1, 2, 512, 4096, prefix_cache=True, exact=True), kv)
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
    sched = Scheduler(SchedulerSettings(2, 3, 64, 4096, prefix_cache=True, exact=False, host_bytes=host_bytes), kv)
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
    sched = Scheduler(SchedulerSettings(1, 2, 64, 4096, prefix_cache=True, exact=False, host_bytes=1 << 20), kv)
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
    sched = Scheduler(
        SchedulerSettings(2, 2, 64, 4096, prefix_cache=True, exact=False),
        kv,
        disk=DiskCache(str(tmp_path), 1 << 30, ident),
    )
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
        SchedulerSettings(2, 2, 64, 4096, prefix_cache=True, exact=False, host_bytes=1 << 30),
        TokenFiles(2),
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
        SchedulerSettings(2, 2, 64, 4096, prefix_cache=True, exact=False),
        TokenFiles(2),
        disk=DiskCache(str(tmp_path), 1 << 30, ident),
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
    sched = Scheduler(
        SchedulerSettings(2, 2, 64, 4096, prefix_cache=True, exact=False),
        kv,
        disk=DiskCache(str(tmp_path), 1 << 30, ident),
    )
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
    sched = Scheduler(SchedulerSettings(1, 3, 64, 4096, prefix_cache=True, exact=False, host_bytes=1 << 20), kv)
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
    from engine_proc.kv.prefix_cache import PROBE, Held, heads_of, prefix_lengths

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
    asked = prompts + arrays
    assert held.holding(asked) == [any(starts_with(a, p) for a in arrays[:5]) for p in asked]
    everyone = Held(dict(enumerate(arrays)))  # many running sequences, some sharing their first tokens
    assert everyone.holding(asked) == [any(starts_with(a, p) for a in arrays) for p in asked]
    assert [(slot, n) for slot, _, n in held.prefixes(base)] == [
        (0, 0),
        (1, 1),
        (2, PROBE - 1),
        (3, PROBE),
        (10, PROBE + 1),
    ]
    # arrays[8] parts from base past the first PROBE tokens: only the whole comparison tells them apart
    assert Held({0: base}).holding([arrays[8], base[: PROBE + 2], arrays[6]]) == [False, True, False]
    assert Held({}).holding([base[:1], base]) == [False, False]


@pytest.mark.parametrize("unit", [1, 4])
def test_a_lookup_ranks_every_stream_as_one_by_one_comparisons_do(unit):
    """The cache's lookup picks, of the entries and the running sequences' streams, the longest reusable prefix,
    then an entry over a running sequence, then the slot the prompt's sequence takes, then the fewest tokens, then
    the first of equals (entries in their order, then the running): many ties, as prompts of a few tokens give."""
    from engine_proc.kv.prefix_cache import Held, PrefixCache

    rng = random.Random(3)
    for _ in range(300):
        base = [rng.randrange(4) for _ in range(40)]  # few token values: many ties
        streams = [np.array(base[: rng.randrange(0, 40)] + [rng.randrange(4)], np.int32) for _ in range(12)]
        slots = rng.sample(range(16), 12)
        cache = PrefixCache(unit)
        k = rng.randrange(0, 13)
        for slot, tokens in zip(slots[:k], streams[:k]):
            cache.keep(slot, tokens)
        held = Held(dict(zip(slots[k:], streams[k:])))
        prompt = np.array(base[: rng.randrange(1, 40)], np.int32)
        into = rng.choice([-1, *slots])
        src, best = -1, (0,)
        for i, (slot, tokens) in enumerate(zip(slots, streams)):
            n = min(common_prefix(prompt, tokens), len(prompt) - 1) // unit * unit
            rank = (n, i < k, slot == into, -len(tokens))
            if n and rank > best:
                src, best = slot, rank
        assert cache.lookup(prompt, held, into=into)[:2] == (src, best[0])
