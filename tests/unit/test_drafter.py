"""engine_proc/step/drafter.py: prompt lookup on made sequences (no model: tests/test_speculative.py runs it on one)."""

from __future__ import annotations

import numpy as np

from cllm.core.protocol import SamplingParams
from engine_proc.sequence import Chunk, ImageSpan, Sequence
from engine_proc.step.draft_pricing import StepCosts
from engine_proc.step.drafter import Drafter


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


def test_where_drafts_are_priced_out_it_tries_again_after_4_steps_then_twice_as_many_each_time():
    """Short drafts price every drafted row at their mean (StepCosts), which can price out an earlier answer's long
    drafts that would pay: a try soon, then tries further apart while they do not pay, and soon again once they do."""
    text = np.tile(np.arange(11, 19, dtype=np.int32), 4)  # a text that repeats: lookup always has a draft
    seqs = []
    for i in range(2):
        seq = Sequence(i, text, SamplingParams(max_tokens=1000), None, slot=i)
        seq.n_cached = len(text)
        seqs.append(seq)
    dear, cheap = StepCosts(), StepCosts()
    dear.observe(2, 0, 0.010)  # a plain step of 2 sequences: 5 ms a sequence
    dear.observe(2, 4, 0.100)  # 4 drafted rows added 90 ms: a row dearer than the token it may save
    cheap.observe(2, 0, 0.010)
    cheap.observe(2, 4, 0.012)
    drafter = Drafter(8, 4096)

    def tried(steps: int) -> list[int]:
        """The steps, of ``steps``, whose decode chunks got drafts."""
        got = []
        for s in range(1, steps + 1):
            chunks = [Chunk(seq, seq.n_cached, seq.n_cached + 1) for seq in seqs]
            drafter.draft(chunks, 64)
            if any(c.draft is not None for c in chunks):
                got.append(s)
        return got

    drafter.costs = dear
    assert dear.break_even(2, 64) == 1.0
    assert tried(200) == [4, 12, 28, 60, 124, 188]  # waits of 4, 8, 16, 32 and at most 64 (PROBE_STEPS)
    drafter.costs = cheap
    assert tried(3) == [1, 2, 3]  # drafting pays: every step drafts
    drafter.costs = dear
    assert tried(12) == [4, 12]  # and where it stops paying, the first try comes after 4 steps again
