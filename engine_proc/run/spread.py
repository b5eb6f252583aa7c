"""How far llama.cpp's logits move between a one-row and a many-row decode of the same tokens: the kernels' own
spread, within which two tokens are tied as far as this model on this machine can tell.

A step that verifies a draft decodes several rows of a sequence; a plain
step, one. Once a stream's view of its cells reaches 512 (past 256 used),
llama.cpp's CPU flash attention splits one row's keys among the threads
and adds the parts up in another order than it does for several rows,
and quantized weights take each activation through a rounding that moves
with it: on SmolLM2-135M a row's most moved logit moves by ~0.6 in Q4_1
and ~0.03 in F16 between the two
(perf/results/2026-12-04-speculation-near-ties-kept-q4-1.md). So a greedy
answer decoded again in other step shapes parts from the first where two
tokens are that close (engine_proc/step/drafter.py: Drafter.keeps).
"""

from __future__ import annotations

import llama_cpp as L
import numpy as np

from engine_proc.run.model_runner import ModelRunner

# Text and code, as what is served: ROWS tokens of it are measured after PREFIX tokens of it. llama.cpp's view of a
# stream's cells grows 256 at a time, and its one-row attention splits the keys from a view of 512: past 256 cells
# the rows take the paths long contexts take (at 200, SmolLM2's Q4_1 read 0.0 here, at 264 and 320 ~0.6).
SAMPLE = (
    "The committee met on Tuesday to review the budget. After a long discussion it agreed to fund the new\n"
    "library, provided that the city would pay for its upkeep, and asked the mayor to report back in May.\n"
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n"
)
PREFIX = 264
ROWS = 16


def logits_spread(runner: ModelRunner, slot: int) -> float:
    """The median over ROWS rows of the largest logit difference between their one-row and many-row decodes, after
    PREFIX tokens (fewer in a shorter context), in the empty stream ``slot`` (emptied again after)."""
    data = SAMPLE.encode()
    buf = (L.llama_token * len(data))()
    n = L.llama_tokenize(runner.vocab, data, len(data), buf, len(buf), False, False)
    at = max(0, min(PREFIX, runner.seq_ctx - ROWS))  # a short context's streams never take the long path
    text = list(buf[:n]) * (at // n + 2)
    rows = text[at : at + ROWS]
    # On all the engine's threads, whatever its probe left it: one thread adds a row's keys up in one part, as
    # several rows do (no spread), and the engine goes back to all of them once the CPUs are free.
    runner.set_threads(runner.threads.most)
    try:
        if at:
            runner.decode_tokens(text[:at], 0, slot, False)
        many = runner.decode_tokens(rows, at, slot, True)
        runner.trim(slot, at)
        one = np.concatenate([runner.decode_tokens([t], at + k, slot, True) for k, t in enumerate(rows)])
    finally:
        runner.set_threads(runner.threads.n)
        runner.clear(slot)
    return float(np.median(np.abs(one - many).max(axis=1)))
