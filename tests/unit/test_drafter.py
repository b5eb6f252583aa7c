"""engine_proc/step/drafter.py: prompt lookup on made sequences (no model: tests/test_speculative.py runs it on one)."""

from __future__ import annotations

import numpy as np

from cllm.core.protocol import SamplingParams
from engine_proc.sampling.sampler import SeqSampler
from engine_proc.sequence import Chunk, ImageSpan, Sequence
from engine_proc.step.draft_pricing import StepCosts
from engine_proc.step.drafter import LONG_RUN, Drafter
from engine_proc.step.ngram_memory import NgramMemory


def test_a_sequence_with_an_image_never_drafts_its_placeholders():
    """Prompt lookup copies what followed an earlier match of the sequence's tail: after an image, the image's
    placeholder ids, which are no tokens llama_decode could take. So a sequence with images does not draft."""
    text = np.arange(11, 17, dtype=np.int32)  # the tail, seen before the image too
    image = np.arange(900_000, 900_008, dtype=np.int32)  # its placeholders (past any vocabulary)
    prompt = np.concatenate((text, image, np.array([5, 6], np.int32), text[:-1]))
    drafts = []
    for images in ([], [ImageSpan(6, 14, np.zeros((8, 2), np.float32))]):
        seq = Sequence(1, prompt, SamplingParams(max_tokens=100), None, images=images)
        seq.append(int(text[-1]))  # sampled: the tail is the text before the image again
        seq.n_cached = len(prompt)
        chunk = Chunk(seq, seq.n_cached, seq.n_cached + 1)
        drafter = Drafter(8, 4096)
        drafter.costs.observe(1, 0, 0.01)  # a plain step of one sequence timed: it may draft
        drafter.draft([chunk], 64)
        drafts.append(chunk.draft)
    assert drafts[0] is not None and drafts[0][0] == 900_000  # what it would draft without images: placeholders
    assert drafts[1] is None


def dear_and_cheap_costs() -> tuple[StepCosts, StepCosts]:
    """Step costs of 2 sequences where a drafted row costs more than the token it may save, and where it costs less."""
    dear, cheap = StepCosts(), StepCosts()
    dear.observe(2, 0, 0.010)  # a plain step of 2 sequences: 5 ms a sequence
    dear.observe(2, 4, 0.100)  # 4 drafted rows added 90 ms
    cheap.observe(2, 0, 0.010)
    cheap.observe(2, 4, 0.012)
    assert dear.break_even(2, 64) == 1.0 and cheap.break_even(2, 64) < 0.5
    return dear, cheap


def steps_drafted(drafter: Drafter, seqs: list[Sequence], steps: int) -> list[int]:
    """Of ``steps`` steps decoding ``seqs``, the ones (from 1) whose decode chunks got drafts."""
    got = []
    for s in range(1, steps + 1):
        chunks = [Chunk(seq, seq.n_cached, seq.n_cached + 1) for seq in seqs]
        drafter.draft(chunks, 64)
        if any(c.draft is not None for c in chunks):
            got.append(s)
    return got


def test_where_text_drafts_are_priced_out_it_tries_again_every_64_steps():
    text = np.tile(np.arange(11, 19, dtype=np.int32), 4)  # a text that repeats: lookup always has a draft
    seqs = [Sequence(i, text, SamplingParams(max_tokens=1000), None, slot=i) for i in range(2)]
    for seq in seqs:
        seq.n_cached = len(text)
    dear, cheap = dear_and_cheap_costs()
    drafter = Drafter(8, 4096)
    drafter.costs = dear
    assert steps_drafted(drafter, seqs, 200) == [64, 128, 192]
    drafter.costs = cheap
    assert steps_drafted(drafter, seqs, 3) == [1, 2, 3]


def test_where_drafts_are_priced_out_an_earlier_answer_is_tried_after_4_steps_then_twice_as_many_each_time():
    """Short drafts price every drafted row at their mean (StepCosts), which can price out an earlier answer's long
    drafts that would pay: where a sequence has one, a try soon, then tries further apart while they do not pay, and
    soon again once they do."""
    prompt = np.arange(100, 140, dtype=np.int32)  # no token twice: nothing for lookup in the text itself
    memory = NgramMemory(1)
    memory.remember(np.concatenate((prompt, np.arange(500, 700, dtype=np.int32))), len(prompt), 11, True)
    drafter = Drafter(64, 4096, memory)
    dear, cheap = dear_and_cheap_costs()
    drafter.costs = dear

    def asking(text: np.ndarray, scope: int) -> list[Sequence]:
        seqs = [
            Sequence(i, text, SamplingParams(max_tokens=500, temperature=0), SeqSampler(None), scope=scope)
            for i in range(2)
        ]
        for seq in seqs:
            seq.n_cached = len(text) - 1
        return seqs

    seqs = asking(prompt, 11)
    assert steps_drafted(drafter, seqs, 200) == [4, 12, 28, 60, 124, 188]  # waits of 4, 8, 16, 32, then 64
    drafter.costs = cheap
    assert steps_drafted(drafter, seqs, 3) == [1, 2, 3]  # drafting pays: every step drafts
    drafter.costs = dear
    assert steps_drafted(drafter, seqs, 12) == [4, 12]  # where it stops paying, the first try after 4 steps again
    drafter = Drafter(64, 4096, memory)
    drafter.costs = dear
    looping = np.concatenate((prompt, np.tile(np.arange(11, 19, dtype=np.int32), 3)))  # lookup has a draft
    assert steps_drafted(drafter, asking(looping, 12), 70) == [64]  # not another scope's answer: text's guesses wait
    short = NgramMemory(1)  # an earlier answer of LONG_RUN - 1 tokens: a draft short of the tile
    short.remember(
        np.concatenate((looping, np.arange(500, 500 + LONG_RUN - 1, dtype=np.int32))), len(looping), 11, True
    )
    drafter = Drafter(64, 4096, short)
    drafter.costs = dear
    assert steps_drafted(drafter, asking(looping, 11), 70) == [64]
