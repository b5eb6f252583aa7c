"""A step's prompt chunks as llama_decode calls, the streamed prompts that end first so their first tokens go out
at once (LLMEngine.step sends each call's tokens before the next call runs)."""

from __future__ import annotations

from engine_proc.sequence import Chunk

# Streamed prompts that end in a step are decoded in groups of at least this
# many tokens, the shortest first, and each group's first tokens are sent
# before the next group runs.
FIRST_TOKEN_GROUP = 48


def prefill_runs(chunks: list[Chunk], exact: bool) -> tuple[list[list[Chunk]], list[list[Chunk]]]:
    """The step's prompt chunks as llama_decode calls: those to run before the decode batch, and after it.

    Chunks share a call (tiny calls cost a few percent more), but for
    exact mode's blocks and scored chunks (every row's logits), which
    alone may be several of one sequence's. A burst of streamed turns
    would otherwise all wait for the whole burst's prefill and the decode
    batch: 6 prompts of 27 tokens took 494 ms in one call here, and as
    three calls of two 501 ms in all, their first tokens coming after
    338 ms on average. So the streamed prompts that end in
    this step (a shared chunk is its sequence's only one this step) go
    first, shortest first, in calls of at least FIRST_TOKEN_GROUP tokens,
    and each call's tokens are sent at once. The decode batch's tokens
    are sent when the step ends either way.
    """
    if not chunks:
        return [], []
    by_slot = lambda c: c.seq.slot  # noqa: E731
    # An image's rows are a llama_decode of their own (a batch holds tokens or embeddings), after the text
    # before them: the scheduler ends a sequence's chunks of a step with its image's.
    alone = [[c] for c in chunks if exact or c.scores or c.image is not None]
    shared = [c for c in chunks if not (exact or c.scores or c.image is not None)]
    first: list[list[Chunk]] = []
    starting = sorted((c for c in shared if c.samples and c.seq.per_step), key=lambda c: c.end - c.start)
    shared = [c for c in shared if not (c.samples and c.seq.per_step)]
    group: list[Chunk] = []
    tokens = 0
    for chunk in starting:
        group.append(chunk)
        tokens += chunk.end - chunk.start
        if tokens >= FIRST_TOKEN_GROUP or chunk is starting[-1]:
            first.append(sorted(group, key=by_slot))
            group, tokens = [], 0
    later = [sorted(shared, key=by_slot)] if shared else []
    return first, later + alone
