"""Speculative drafts by prompt lookup: a sequence's next tokens guessed from its own text.

A model that copies (a code file to edit, a document to quote) writes what
its prompt already holds. When a sequence's last tokens appeared earlier in
its prompt or output, the tokens that followed them there are a draft of
what comes next. The engine feeds the draft in the step's batch right after
the sequence's last sampled token; the sampler then checks the draft row by
row and keeps the tokens it would have sampled anyway (recorder.Recorder._verify).

Verifying costs prefill work: on a 2-core CPU a draft of 8 tokens makes the
step about 5x as long as a one-token decode, so a draft pays only when most
of it is accepted, and less so the more sequences already share the step
(their decode is then compute-bound too). So each sequence drafts only while
its recent drafts were accepted, its draft growing while they are accepted
whole, and the share it must keep is what the engine measures: the time a
drafted token adds to a step against a plain step's time per sequence, at
the step's number of sequences (StepCosts). On a GPU, where verifying is
nearly free, that share is low; on this CPU at 32 sequences, nearly all.

With a memory of earlier answers (engine_proc/step/ngram_memory.py), a sequence
whose last tokens an earlier greedy answer of its scope had drafts that
answer's next tokens, as far as the memory's marked entries go (its history
says they hold) and as far as such drafts pay: how far a remembered answer
holds is the engine's to learn, not each sequence's (a model whose greedy
text parts at near ties between differently shaped steps, as quantized
weights do more often, parts from its earlier answers more often), so every
draft from the memory counts in one estimate of the odds that a remembered
token holds once the one before it did, and a draft goes on while its last
token's odds still beat the share it must keep (Odds.length). Its guesses
from other text go as prompt lookup's do. A seeded sampled request drafts
from its own text only, so that its text repeats whatever came before it.
Where a remembered token and the verifying row's argmax are closer than
llama.cpp's kernels move a logit between step shapes (measured at the
start: engine_proc/run/spread.py), a greedy sequence keeps the remembered
one (Drafter.keeps): the same request asked again then gets its earlier
answer back whole, in drafts, where the argmax would part from it at the
first near tie.

With a draft model (`--spec-type draft-simple`, engine_proc/step/draft_model.py), a sequence that drafts by the
same rules and finds nothing in text (or every one, without ngram) asks the model for up to --spec-draft-n-max
tokens; the model's time counts in what a drafted token costs.
"""

from __future__ import annotations

import time

import numpy as np

from cllm.core.config import ServeConfig
from cllm.core.protocol import EngineStats
from engine_proc.run.draft_runner import DraftRunner
from engine_proc.run.model_runner import ModelRunner
from engine_proc.run.spread import logits_spread
from engine_proc.sampling.sampler import Sampler
from engine_proc.sequence import DRAFT_ROWS, FIRST_DRAFT, Chunk, Drafting, Sequence
from engine_proc.step.draft_model import DraftModel
from engine_proc.step.draft_pricing import Odds, StepCosts, prior
from engine_proc.step.ngram_memory import NgramMemory, memory_path

LONGEST_MATCH = 16  # tokens of a sequence's tail matched against its text: the longest match wins
SHORTEST_MATCH = 4  # shorter matches are too common to predict anything
# Steps without drafts, where they do not pay, before trying again: PROBE_STEPS; where a sequence has LONG_RUN tokens
# or more of an earlier answer to draft, FIRST_PROBE, doubling up to PROBE_STEPS while tries do not pay. Short drafts
# cannot tell the step costs what long ones add (StepCosts prices every row at their mean), and on the CPU a draft of
# 64 verifies under llama.cpp's flash-attention tile, beside plain rows too, at about 0.6x a shorter one's price a row
# (draft_pricing.py): so a run of short drafts may price out an earlier answer's whole-tile drafts, which a try soon
# brings back. Shorter runs and text's guesses wait longer: at 8 sequences on this CPU they pay about what they cost.
FIRST_PROBE = 4
PROBE_STEPS = 64
LONG_RUN = 64
RATE_MEMORY = 0.5  # weight of a sequence's earlier acceptance rate against its last draft's
# A run of the memory's marked entries shorter than this is drafted as a guess, not whole: a few tokens of an
# earlier answer are often a common phrase.
TRUSTED_RUN = 8


def make_drafter(config: ServeConfig, runner: ModelRunner) -> Drafter | None:
    """The engine's drafter (None without --spec-type), its memory read from --cache-dir's file if there, its draft
    model loaded beside the runner's (ModelLoadError if it cannot draft for it)."""
    types = config.spec_types
    if not types:
        return None
    model_path = runner.info.model_path
    memory = NgramMemory(config.spec_memory) if config.spec_memory and "ngram" in types else None
    path = memory_path(config.cache_dir, model_path) if memory is not None and config.cache_dir else None
    if path is not None:
        memory.load(path)
    model = None
    spread = logits_spread(runner, 0) if memory is not None else 0.0  # before any stream holds cells
    if "draft-simple" in types and config.model_draft is not None:
        draft = DraftRunner(config.model_draft, runner, config)
        model = DraftModel(draft, config.spec_draft_n_max, config.spec_draft_n_min, config.spec_draft_p_min)
    return Drafter(
        config.draft_max, runner.seq_ctx, memory, path, config.spec_memory_shared, "ngram" in types, model, spread
    )


class Drafter:
    def __init__(
        self,
        draft_max: int,
        seq_ctx: int,
        memory: NgramMemory | None = None,
        memory_file: str | None = None,
        shared: bool = False,
        ngram: bool = True,
        model: DraftModel | None = None,
        spread: float = 0.0,
    ):
        self.draft_max = draft_max
        self.seq_ctx = seq_ctx
        self.memory = memory
        self.memory_file = memory_file  # where the memory is kept when the engine stops (--cache-dir)
        self.shared = shared  # every scope's answers draft for all (--spec-memory-shared)
        self.drafted = 0  # tokens, since the engine started
        self.accepted = 0
        self.drafts = 0  # verified drafts
        self.step_drafted: list[int] = []  # per step that drafted, until the engine's next stats
        self.step_accepted: list[int] = []
        self._drafted = self._accepted = 0  # this step's
        self.costs = StepCosts()
        self._unpaid = 0  # steps since drafting last paid or was tried
        self._probe_after = FIRST_PROBE  # unpaid steps before the next try
        self.ngram = ngram  # drafts from text (--spec-type ngram)
        self.model = model  # drafts by a draft model where text gives none (draft-simple)
        self._model_seconds = 0.0  # this step's drafting by the model
        self.recall = Odds()  # how far the memory's earlier answers hold
        self.spread = spread  # logits apart the kernels' step shapes move a token (engine_proc/run/spread.py)

    def draft(self, decode: list[Chunk], budget: int) -> None:
        """Lengthen the step's decode chunks with drafts, within ``budget`` more tokens."""
        n = len(decode)
        budget = min(budget, DRAFT_ROWS)
        need = self.costs.break_even(n, budget)  # a draft's share at the price of a step drafting its whole budget
        probe = need >= 1.0
        if probe:
            self._unpaid += 1
            if n not in self.costs.plain or self._unpaid < self._probe_after:
                return
            if self._unpaid < PROBE_STEPS and not any(self._remembers(c.seq) for c in decode):
                return
            # Now and then, to see whether drafting pays again: drafts as long as a sequence alone would draft, so
            # that the step costs learn what long ones add, kept whatever they are priced at.
            need = prior(1)
            self._probe_after = min(2 * self._probe_after, PROBE_STEPS)
        else:
            self._probe_after = FIRST_PROBE
        self._unpaid = 0
        drafted: list[Chunk] = []
        asks: list[tuple[Chunk, int]] = []  # chunks whose drafts the draft model makes, with their room
        for chunk in decode:
            seq = chunk.seq
            if not seq.params.speculative or seq.images or budget <= 0:  # an image's placeholders are no tokens
                continue
            d = seq.drafting
            if d is None:
                d = seq.drafting = Drafting()
            room = min(self.draft_max, budget, seq.params.max_tokens - len(seq.output) - 1, self.seq_ctx - chunk.end)
            draft = self._draft(seq, d, room, need)
            if isinstance(draft, int):
                asks.append((chunk, draft))
                budget -= draft
            elif draft is not None:
                chunk.draft = draft
                budget -= len(draft)
                drafted.append(chunk)
        if asks:
            drafted += self._ask_model(asks)
        # llama.cpp splits a batch of several KV streams into ubatches that take as many tokens from each of a run of
        # streams whose ids follow one another: drafts of one length keep the extra ubatches few. The length that
        # drafts the most rows wins; longer drafts are cut to it, shorter ones wait (a plain step of theirs costs
        # what the extra ubatch would).
        if len(drafted) > 1:
            sizes = sorted(len(c.draft) for c in drafted)
            k = max(sizes, key=lambda n: n * sum(s >= n for s in sizes))
            for c in drafted:
                if len(c.draft) > k and c.seq.drafting.recalled:  # the remembered token its last row should give
                    c.seq.drafting.after = int(c.draft[k])
                c.draft = c.draft[:k] if len(c.draft) >= k else None
            drafted = [c for c in drafted if c.draft is not None]
        if n > 1 and drafted and not probe:
            drafted = self._paying(drafted, n)
        for c in drafted:
            c.end += len(c.draft)

    def _paying(self, drafted: list[Chunk], n: int) -> list[Chunk]:
        """The drafts that pay together, likeliest kept first: what they add to the step (its fixed part too) against
        the plain steps their expected kept tokens save; none if no such set gains."""
        plain = self.costs.plain[n] / n  # a kept token saves a sequence's share of a plain step

        def expected(c: Chunk) -> float:
            d, k = c.seq.drafting, len(c.draft)
            return self.recall.expected(k) if d.recalled else d.rate * k

        ranked = sorted(((expected(c), c) for c in drafted), key=lambda e: -e[0] / len(e[1].draft))
        best, keep, kept, rows = 0.0, 0, 0.0, 0
        for i, (e, c) in enumerate(ranked, 1):
            kept, rows = kept + e, rows + len(c.draft)
            gain = kept * plain - self.costs.added(n, rows)
            if gain > best:
                best, keep = gain, i
        for _, c in ranked[keep:]:
            c.draft = None
        return [c for _, c in ranked[:keep]]

    def _ask_model(self, asks: list[tuple[Chunk, int]]) -> list[Chunk]:
        """The chunks the draft model drafted for, in one batch a draft token (DraftModel.drafts)."""
        assert self.model is not None
        t = time.perf_counter()
        drafts = self.model.drafts([(c.seq, room) for c, room in asks])
        self._model_seconds += time.perf_counter() - t
        for (c, _), draft in zip(asks, drafts):
            c.draft = draft
        return [c for c, _ in asks if c.draft is not None]

    def _draft(self, seq: Sequence, d: Drafting, room: int, need: float) -> np.ndarray | int | None:
        """The sequence's draft: an earlier answer from the memory, else a guess from its own text or the memory's,
        else the room the draft model may draft in (an int)."""
        if room <= 0:
            return None
        # one token past the room: the one the draft's last row should give (Drafter.keeps)
        recalled, trusted = self._recall(seq, room + 1)
        k = self.recall.length(need, min(trusted, room)) if trusted >= TRUSTED_RUN else 0
        if k:
            d.recalled, d.after = True, recalled[k] if k < trusted else -1
            return np.array(recalled[:k], np.int32)
        d.recalled = False
        if d.rest:
            d.rest -= 1
            return None
        if d.rate < need:
            d.rate += (1 - d.rate) / 8  # drift back, to try again once the text may have turned to copying
            return None
        room = min(room, d.want)
        text = seq.known(len(seq.prompt) + len(seq.output))
        draft = lookup(text, room) if self.ngram else None
        if draft is None and recalled:
            draft = np.array(recalled[:room], np.int32)
        if draft is None and self.model is not None:
            return min(room, self.model.n_max)
        return draft

    def _recall(self, seq: Sequence, k: int) -> tuple[list[int], int]:
        """Up to k tokens of an earlier answer of the sequence's scope that follow its text's tail, and how many of them
        are marked (NgramMemory.chain); none for a seeded sampled request, which drafts from its own text only, so that
        its text repeats."""
        if self.memory is None or (seq.params.temperature > 0 and seq.params.seed is not None):
            return [], 0
        text = seq.known(len(seq.prompt) + len(seq.output))
        return self.memory.chain(text, 0 if self.shared else seq.scope, k)

    def _remembers(self, seq: Sequence) -> bool:
        """Whether the memory holds a long earlier answer for the sequence to draft: LONG_RUN marked entries."""
        return seq.params.speculative and not seq.images and self._recall(seq, LONG_RUN)[1] >= LONG_RUN

    def keeps(self, seq: Sequence, sampler: Sampler, row: int, token: int, drafted: int) -> bool:
        """Whether a remembered token the verifying row did not pick is kept: a plain greedy sequence's, within the
        kernels' spread of the row's argmax.

        The earlier answer was decoded in other step shapes (mostly a row a
        step); where its token and this row's argmax are closer than the
        kernels move a logit between step shapes, either is the greedy token
        as far as the model can tell, and keeping the earlier one brings the
        rest of the answer back in drafts, where the argmax would part from
        it for good.
        """
        return seq.drafting.recalled and sampler.near(seq.sampler, row, token, drafted, self.spread)

    def verified(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """The sampler kept ``accepted`` of the ``drafted`` tokens: adapt the sequence's next draft."""
        self._drafted += drafted
        self._accepted += accepted
        self.drafts += 1
        d = seq.drafting
        d.drafted += drafted
        d.accepted += accepted
        if d.recalled:  # the memory's: how far it held says how far to trust it, not how the text copies
            self.recall.count(accepted, drafted)
            return
        d.rate = RATE_MEMORY * d.rate + (1 - RATE_MEMORY) * accepted / drafted
        if accepted == drafted:
            d.want = min(2 * d.want, self.draft_max)
            d.misses = 0
        elif accepted:
            d.want = max(accepted, FIRST_DRAFT)
            d.misses = 0
        else:
            d.want = FIRST_DRAFT
            d.misses += 1
            d.rest = (1 << min(d.misses, 6)) - 1  # 1, 3, 7 ... 63 steps

    def remember(self, seq: Sequence) -> None:
        """A sequence leaves: its draft model stream is free; its text goes into the memory, its generated tokens
        marked if it decoded greedily (without a grammar, biases or penalties, which make another request's greedy
        text differ)."""
        if self.model is not None:
            self.model.leave(seq)
        if self.memory is None or seq.images:
            return
        p = seq.params
        greedy = (
            p.temperature <= 0
            and p.grammar is None
            and not p.logit_bias
            and p.repetition_penalty == 1.0
            and not p.presence_penalty
            and not p.frequency_penalty
        )
        scope = 0 if self.shared else seq.scope
        self.memory.remember(seq.known(len(seq.prompt) + len(seq.output)), len(seq.prompt), scope, greedy)

    def report(self, stats: EngineStats) -> None:
        """Its counters into the engine's figures; the per-step ones start again."""
        stats.drafted_tokens, stats.accepted_tokens, stats.drafts = self.drafted, self.accepted, self.drafts
        stats.step_drafted, stats.step_accepted = self.step_drafted, self.step_accepted
        self.step_drafted, self.step_accepted = [], []

    def close(self) -> None:
        if self.memory is not None and self.memory_file is not None:
            self.memory.save(self.memory_file)
        if self.model is not None:
            self.model.runner.close()

    def end_step(self, n: int, seconds: float) -> None:
        """The step's decode of ``n`` sequences (and the drafts) took ``seconds``, and the draft model's drafting
        what it took: a drafted token's cost counts both."""
        if self._drafted:
            seconds += self._model_seconds
        self._model_seconds = 0.0
        self.costs.observe(n, self._drafted, seconds)
        if self._drafted:
            self.drafted += self._drafted
            self.accepted += self._accepted
            self.step_drafted.append(self._drafted)
            self.step_accepted.append(self._accepted)
            self._drafted = self._accepted = 0


def lookup(tokens: np.ndarray, k: int) -> np.ndarray | None:
    """Up to ``k`` tokens that followed the longest, then latest, earlier match of the text's tail.

    Candidates are the earlier places of the last token; each is extended
    backwards while it matches the tail, all at once with numpy. A match
    whose continuation runs into the tail (a text that repeats itself, as a
    small model's loops and a file's repeated lines do) goes on around it: if
    the text repeats from the match, its next tokens are the ones since.
    """
    n = len(tokens)
    if n < SHORTEST_MATCH + 1:
        return None
    cand = np.flatnonzero(tokens[: n - 1] == tokens[n - 1])
    if not cand.size:
        return None
    length = np.ones(cand.size, np.int32)
    alive = np.ones(cand.size, bool)
    for j in range(1, min(LONGEST_MATCH, n - 1)):
        prev = cand - j
        alive &= prev >= 0
        alive[alive] = tokens[prev[alive]] == tokens[n - 1 - j]
        if not alive.any():
            break
        length += alive
    best = int(length.max())
    if best < SHORTEST_MATCH:
        return None
    at = int(cand[np.flatnonzero(length == best)[-1]]) + 1
    return np.resize(tokens[at : at + k], k)  # repeats tokens[at:] where they end before k
