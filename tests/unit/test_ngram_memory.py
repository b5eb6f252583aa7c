"""engine_proc/step/ngram_memory.py, and the drafter drafting from it, on made token arrays (no model:
tests/test_spec_memory.py runs it in a server)."""

from __future__ import annotations

import numpy as np

from cllm.core.protocol import SamplingParams
from engine_proc.sampling.sampler import SeqSampler
from engine_proc.sequence import FIRST_DRAFT, Chunk, Sequence
from engine_proc.step.drafter import TRUSTED_RUN, Drafter
from engine_proc.step.ngram_memory import CONTEXT, ENTRY_BYTES, LONG_CONTEXT, NgramMemory

RNG = np.random.default_rng(7)
PROMPT = RNG.integers(0, 49152, 300).astype(np.int32)
ANSWER = RNG.integers(0, 49152, 200).astype(np.int32)
TEXT = np.concatenate((PROMPT, ANSWER))


def test_an_answer_comes_back_whole_in_its_own_scope_only():
    memory = NgramMemory(1)
    memory.remember(TEXT, len(PROMPT), scope=11, greedy=True)
    tokens, trusted = memory.chain(PROMPT, 11, 64)
    assert tokens == ANSWER[:64].tolist() and trusted == 64  # generated greedily: all marked
    tokens, trusted = memory.chain(TEXT[:350], 11, 500)
    assert tokens == ANSWER[50:].tolist() and trusted == 150  # on to the end of what it saw
    assert memory.chain(PROMPT, 12, 64) == ([], 0)  # another client's key: nothing
    assert memory.chain(PROMPT, 0, 64) == ([], 0)  # nor requests without a key
    tokens, trusted = memory.chain(PROMPT[:100], 11, 10)  # the prompt's own text is there, not marked
    assert tokens == PROMPT[100:110].tolist() and trusted == 0


def test_a_draft_ends_where_two_remembered_texts_part():
    memory = NgramMemory(1)
    memory.remember(TEXT, len(PROMPT), scope=11, greedy=True)
    edited = TEXT.copy()
    edited[len(PROMPT) + 40] += 1  # a second answer to the same prompt parts from the first at its 41st token
    memory.remember(edited, len(PROMPT), scope=11, greedy=True)
    # both answers had the same 40 tokens, then each its own: the model decides the 41st, the draft stops before it
    assert memory.chain(PROMPT, 11, 64) == (ANSWER[:40].tolist(), 40)
    # past the fork each answer's own windows go on
    assert memory.chain(edited[: len(PROMPT) + 41], 11, 20)[0] == edited[len(PROMPT) + 41 : len(PROMPT) + 61].tolist()
    assert memory.chain(PROMPT, 12, 64) == ([], 0)  # the fork is scope 11's: another scope still has nothing


def test_a_window_filed_again_with_the_same_token_keeps_its_mark():
    memory = NgramMemory(1)
    memory.remember(TEXT, len(PROMPT), scope=11, greedy=True)
    memory.remember(TEXT, len(TEXT), scope=11, greedy=True)  # the answer again, this time as a prompt
    assert memory.chain(PROMPT, 11, 64) == (ANSWER[:64].tolist(), 64)


def test_a_window_a_text_holds_twice_with_two_next_tokens_is_a_fork():
    text = np.concatenate((PROMPT[:100], [7], PROMPT[:100], [8], PROMPT[200:300])).astype(np.int32)
    memory = NgramMemory(1)
    memory.remember(text, 0, scope=11, greedy=True)
    assert memory.chain(PROMPT[:100], 11, 8) == ([], 0)  # followed by 7 once and by 8 once: no draft
    assert memory.chain(text[:102], 11, 8)[0] == text[102:110].tolist()


def test_a_longer_window_tells_two_answers_apart_where_a_short_one_forks():
    """Two answers share a 16-token window and part after it (a file copied, and the same file with a name
    renamed): the LONG_CONTEXT tokens before it tell which answer a draft follows."""
    shared = ANSWER[100 : 100 + CONTEXT]
    copied = np.concatenate((PROMPT, ANSWER[:LONG_CONTEXT], shared, ANSWER[150:])).astype(np.int32)
    renamed = np.concatenate((PROMPT, ANSWER[50 : 50 + LONG_CONTEXT], shared, ANSWER[120:150])).astype(np.int32)
    memory = NgramMemory(1)
    memory.remember(copied, len(PROMPT), scope=11, greedy=True)
    memory.remember(renamed, len(PROMPT), scope=11, greedy=True)
    fork = len(PROMPT) + LONG_CONTEXT + CONTEXT  # where the two answers part, after the shared window
    for answer in (copied, renamed):
        tokens, trusted = memory.chain(answer[: fork - 20], 11, 40)
        assert tokens == answer[fork - 20 : fork + 20].tolist() and trusted == 40  # on through the fork
    # The prompt alone, then the shared window: too short a text to tell which, the draft stops at the fork.
    assert memory.chain(np.concatenate((PROMPT[:10], shared)).astype(np.int32), 11, 8) == ([], 0)
    # Nor does a text prompt lookup filed: its longer windows are not kept (only an answer's are).
    memory = NgramMemory(1)
    memory.remember(copied, len(copied), scope=11, greedy=True)
    memory.remember(renamed, len(renamed), scope=11, greedy=True)
    assert memory.chain(copied[: fork - 20], 11, 40)[0] == copied[fork - 20 : fork].tolist()


def test_a_sampled_answer_is_remembered_unmarked():
    memory = NgramMemory(1)
    memory.remember(TEXT, len(PROMPT), scope=3, greedy=False)
    assert memory.chain(PROMPT, 3, 8) == (ANSWER[:8].tolist(), 0)


def test_the_memory_is_bounded_and_a_newer_text_takes_the_slots():
    memory = NgramMemory(1)
    assert memory.slots * ENTRY_BYTES <= 1 << 20
    size = memory.tags.nbytes + memory.tokens.nbytes + memory.flags.nbytes
    for scope in range(1, 400):  # ~200k windows into 65k slots
        memory.remember(RNG.integers(0, 49152, 500).astype(np.int32), 250, scope, True)
    assert memory.tags.nbytes + memory.tokens.nbytes + memory.flags.nbytes == size
    memory.remember(TEXT, len(PROMPT), 11, True)
    assert memory.chain(PROMPT, 11, 64)[0] == ANSWER[:64].tolist()


def test_it_is_kept_in_a_file(tmp_path):
    memory = NgramMemory(1)
    memory.remember(TEXT, len(PROMPT), 11, True)
    path = str(tmp_path / "m.mem")
    memory.save(path)
    again = NgramMemory(1)
    assert again.load(path)
    assert again.chain(PROMPT, 11, 64) == (ANSWER[:64].tolist(), 64)
    bigger = NgramMemory(2)  # another size: not read, empty
    assert not bigger.load(path) and bigger.chain(PROMPT, 11, 8) == ([], 0)
    with open(path, "r+b") as f:
        f.truncate(1000)
    assert not NgramMemory(1).load(path)


def step(drafter: Drafter, seq: Sequence) -> Chunk:
    seq.n_cached = len(seq.prompt) + len(seq.output) - 1
    chunk = Chunk(seq, seq.n_cached, seq.n_cached + 1)
    drafter.draft([chunk], 128)
    return chunk


def drafter_of(text: np.ndarray, greedy: bool) -> Drafter:
    """A drafter whose memory has ``text`` (PROMPT, then what scope 11's sequence generated); a plain step of one
    sequence timed, so that it may draft."""
    memory = NgramMemory(1)
    memory.remember(text, len(PROMPT), 11, greedy)
    drafter = Drafter(64, 4096, memory)
    drafter.costs.observe(1, 0, 0.01)
    return drafter


def sequence(params: SamplingParams, scope: int) -> Sequence:
    seq = Sequence(1, PROMPT[:-1], params, SeqSampler(None), scope=scope)
    seq.append(int(PROMPT[-1]))
    return seq


def test_the_drafter_drafts_a_remembered_answer_whole_and_only_in_its_scope():
    drafter = drafter_of(TEXT, greedy=True)
    greedy = SamplingParams(max_tokens=500, temperature=0)
    assert step(drafter, sequence(greedy, 11)).draft.tolist() == ANSWER[:64].tolist()
    assert step(drafter, sequence(greedy, 12)).draft is None  # another scope
    seeded = SamplingParams(max_tokens=500, temperature=0.8, seed=5)  # its own text only, to repeat
    assert step(drafter, sequence(seeded, 11)).draft is None
    unseeded = SamplingParams(max_tokens=500, temperature=0.8)
    assert len(step(drafter, sequence(unseeded, 11)).draft) == 64


def test_an_unmarked_or_short_run_is_a_guess_of_the_first_draft_size():
    greedy = SamplingParams(max_tokens=500, temperature=0)
    for drafter in (drafter_of(TEXT, greedy=False), drafter_of(TEXT[: len(PROMPT) + TRUSTED_RUN - 1], greedy=True)):
        assert step(drafter, sequence(greedy, 11)).draft.tolist() == ANSWER[:FIRST_DRAFT].tolist()


def test_recalled_drafts_that_failed_shorten_the_next_of_every_sequence():
    drafter = drafter_of(TEXT, greedy=True)
    seq = sequence(SamplingParams(max_tokens=500, temperature=0), 11)
    assert len(step(drafter, seq).draft) == 64
    drafter.verified(seq, 64, 0)
    drafter.verified(seq, 64, 0)  # twice in a row: a remembered token holds with odds near 3 in 4 now
    assert (seq.drafting.drafted, seq.drafting.accepted) == (128, 0)
    # how far the memory holds is the engine's to learn: a new sequence's first draft from it is short too
    fresh = sequence(SamplingParams(max_tokens=500, temperature=0), 11)
    chunk = step(drafter, fresh)
    assert chunk.draft is not None and len(chunk.draft) <= FIRST_DRAFT


def test_the_context_is_what_the_hash_spans():
    memory = NgramMemory(1)
    memory.remember(TEXT, len(PROMPT), 11, True)
    changed = PROMPT.copy()
    changed[-CONTEXT] += 1  # the first token of the last window
    assert memory.chain(changed, 11, 8) == ([], 0)
    changed = PROMPT.copy()
    changed[-CONTEXT - 1] += 1  # before it: the window is the same
    assert memory.chain(changed, 11, 8)[0] == ANSWER[:8].tolist()


def test_after_a_recalled_draft_failed_the_next_is_about_what_it_kept_then_grows():
    drafter = drafter_of(TEXT, greedy=True)
    seq = sequence(SamplingParams(max_tokens=500, temperature=0), 11)
    assert len(step(drafter, seq).draft) == 64
    drafter.verified(seq, 64, 10)  # the text parted from the remembered answer after 10 tokens (it goes on here)
    first = len(step(drafter, seq).draft)
    assert 5 <= first <= 20
    drafter.verified(seq, first, first)
    second = len(step(drafter, seq).draft)
    assert first < second < 64
    for _ in range(20):  # kept whole, again and again: the whole run again
        drafter.verified(seq, second, second)
        second = len(step(drafter, seq).draft)
    assert second == 64


def test_at_several_sequences_drafts_go_only_where_they_pay_for_their_ubatch():
    drafter = drafter_of(TEXT, greedy=True)
    drafter.costs.observe(2, 0, 0.010)  # a plain step of two sequences: 5 ms a token
    for _ in range(3):  # what drafts add: 29 ms for their ubatch and 2.7 ms a row
        drafter.costs.observe(2, 4, 0.050)
        drafter.costs.observe(2, 64, 0.210)
    greedy = SamplingParams(max_tokens=500, temperature=0)

    def step_of(seqs: list[Sequence]) -> list[Chunk]:
        chunks = []
        for seq in seqs:
            seq.n_cached = len(seq.prompt) + len(seq.output) - 1
            chunks.append(Chunk(seq, seq.n_cached, seq.n_cached + 1))
        drafter.draft(chunks, 256)
        return chunks

    first = sequence(greedy, 11)
    assert [len(c.draft) for c in step_of([first, sequence(greedy, 11)])] == [64, 64]  # long and likely: they pay
    drafter.verified(first, 64, 0)
    drafter.verified(first, 64, 0)  # the memory stopped holding: its next drafts are a token or two, unlikely kept
    assert [c.draft for c in step_of([sequence(greedy, 11), sequence(greedy, 11)])] == [None, None]


def test_a_remembered_draft_knows_the_token_its_last_row_should_give():
    """Drafter.keeps weighs the draft's last row against the answer's next token: the one after the draft, also where
    a step of several sequences cuts their drafts to one length."""
    drafter = drafter_of(TEXT, greedy=True)
    greedy = SamplingParams(max_tokens=500, temperature=0)
    seq = sequence(greedy, 11)
    assert len(step(drafter, seq).draft) == 64 and seq.drafting.after == ANSWER[64]
    # Beside a second sequence 40 tokens into the same answer with room for 40 more: both drafts are cut to 40.
    drafter.costs.observe(2, 0, 0.02)  # a plain step of two sequences timed: they may draft
    first = sequence(greedy, 11)
    second = Sequence(2, PROMPT[:-1], SamplingParams(max_tokens=82, temperature=0), SeqSampler(None), scope=11)
    for t in np.concatenate((PROMPT[-1:], ANSWER[:40])):
        second.append(int(t))
    chunks = []
    for s in (first, second):
        s.n_cached = len(s.prompt) + len(s.output) - 1
        chunks.append(Chunk(s, s.n_cached, s.n_cached + 1))
    drafter.draft(chunks, 128)
    assert [len(c.draft) for c in chunks] == [40, 40]
    assert first.drafting.after == ANSWER[40] and second.drafting.after == ANSWER[80]
