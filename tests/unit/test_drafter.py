"""engine_proc/step/drafter.py: prompt lookup on made sequences (no model: tests/test_speculative.py runs it on one)."""

from __future__ import annotations

import numpy as np

from cllm.core.protocol import SamplingParams
from engine_proc.sequence import Chunk, ImageSpan, Sequence
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
