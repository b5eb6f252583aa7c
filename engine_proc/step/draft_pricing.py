"""Whether a speculative draft pays: what drafted rows add to a step (StepCosts) and the odds that a remembered
answer's tokens are kept (Odds), which engine_proc/step/drafter.py weighs against each other."""

from __future__ import annotations

import math

# Until the engine has timed both kinds of step, a drafted token is taken to cost
# what a step of one sequence costs (its weights read) about, as on a 2-core CPU.
VERIFY_COST = 1.0
COST_MEMORY = 0.7  # weight of the earlier timings in StepCosts' running means
FIT_MEMORY = 0.9  # and in its fit of what drafts add, which needs drafts of several sizes
SPREAD = 0.25  # drafts whose sizes spread less than this share of their mean cannot tell a fixed part from the rest
RECALL_MEMORY = 0.9  # weight of the earlier drafts from the memory in Odds' counts against the last one's


class Odds:
    """The odds that a drafted token is kept once the one before it was: tokens kept against drafts cut short (a
    token rejected), recent drafts weighing most. The k-th token of a draft is kept with these odds to the k."""

    def __init__(self, kept: float = 8.0, lost: float = 0.05):
        self.kept = kept  # the start: above 99 in 100, a whole run of marked entries until drafts of it fail
        self.lost = lost

    def count(self, accepted: int, drafted: int) -> None:
        self.kept = RECALL_MEMORY * self.kept + accepted
        self.lost = RECALL_MEMORY * self.lost + (accepted < drafted)

    @property
    def odds(self) -> float:
        return self.kept / (self.kept + self.lost)

    def expected(self, k: int) -> float:
        """Tokens of a draft of k expected kept: each is kept with these odds to its place."""
        odds = self.odds
        return k if odds >= 1.0 else odds * (1 - odds**k) / (1 - odds)

    def length(self, need: float, room: int) -> int:
        """The longest draft, up to ``room``, whose last token is still kept with odds above ``need``, the share of
        a drafted token that must be kept for it to pay (0: not even the first)."""
        odds = self.odds
        if odds <= need:
            return 0
        if need <= 0:
            return room
        return min(room, max(1, int(math.log(need) / math.log(odds))))


class StepCosts:
    """Running figures of decode steps of n sequences: a step without drafts, and what drafts add to one.

    What drafts add is fitted as a fixed part plus a part a drafted row
    (least squares over the steps timed, recent ones weighing most): at
    several sequences llama.cpp takes as many tokens from each of a run of
    streams whose ids follow one another in a ubatch, one of every stream
    first, so where some sequences draft, their drafts go in ubatches of
    their own (one a run of consecutive drafting streams), and a short draft
    pays for its ubatch as a long one does. llama.cpp's CPU flash attention
    adds to it: it takes a stream's queries in tiles of 64 only where a
    ubatch holds 64 of them, one at a time otherwise, so on a 2-core CPU a
    drafted row costs 6-8 ms in drafts of 3-55 tokens a sequence and 3-4.5
    in drafts of 63 (at 900 tokens of context;
    perf/results/2026-12-03-draft-rows-flash-attention-tile.md), and beside
    sequences that do not draft, a draft keeps the tile only at 64 tokens
    (perf/results/2026-12-05-verify-layouts-c8-repeated-and-first-run-nospec.md).
    Until drafts of sizes far enough apart were timed, every row costs
    their mean.
    """

    def __init__(self):
        self.plain: dict[int, float] = {}  # sequences -> seconds of a step without drafts
        # sequences -> decayed sums over steps with drafts: 1, rows, seconds added, rows², rows × seconds added
        self.sums: dict[int, list[float]] = {}

    def observe(self, n: int, drafted: int, seconds: float) -> None:
        plain = self.plain.get(n)
        if not drafted:
            self.plain[n] = _mean(plain, seconds)
        elif plain is not None:  # a noisy step that stops drafting is corrected by the next probe
            added = max(seconds - plain, 0.0)
            new = (1.0, drafted, added, drafted * drafted, drafted * added)
            old = self.sums.get(n, [0.0] * 5)
            self.sums[n] = [FIT_MEMORY * a + b for a, b in zip(old, new)]

    def added(self, n: int, rows: int) -> float:
        """Seconds ``rows`` drafted rows add to a step of n sequences (0 before a step with drafts was timed)."""
        sums = self.sums.get(n)
        if sums is None:
            return 0.0
        w, k, e, kk, ke = sums
        k, e, kk, ke = k / w, e / w, kk / w, ke / w  # means
        spread = kk - k * k
        if spread > (SPREAD * k) ** 2:
            per_row = (ke - k * e) / spread
            fixed = e - per_row * k
            if per_row > 0 and fixed >= 0:
                return fixed + per_row * rows
        return e / k * rows

    def break_even(self, n: int, rows: int) -> float:
        """The share of a step's ``rows`` drafted rows that must be kept for drafting to pay at n sequences; 1 or
        more: do not draft.

        A kept token saves a plain step's time per sequence; the drafted
        rows cost what they add. A sequence alone goes by the prior, so that
        it drafts the same way every run and its seeded text repeats.
        """
        plain = self.plain.get(n)
        if plain is None:
            return 1.0  # no draft until a plain step of n sequences is timed
        if n == 1 or n not in self.sums or plain <= 0 or rows <= 0:
            return prior(n)
        return min(1.0, self.added(n, rows) / rows * n / plain)


def prior(n: int) -> float:
    return n * VERIFY_COST / (1 + n * VERIFY_COST)


def _mean(mean: float | None, x: float) -> float:
    return x if mean is None else COST_MEMORY * mean + (1 - COST_MEMORY) * x
