"""A run's sampled tokens recorded into its sequences: the postprocess of a step.

Each sampling chunk's token becomes the sequence's SeqOutput (its finish
checked on EOS, max_tokens and stop tokens, its logprobs read from its row),
drafts are verified row by row, scored chunks' prompt logprobs gathered,
and the finished handed back for the scheduler to retire or park.
"""

from __future__ import annotations

from cllm.core.protocol import SeqOutput
from engine_proc.run.model_runner import ModelRunner
from engine_proc.sampling.sampler import Sampler, SeqSampler
from engine_proc.scheduler import Scheduler
from engine_proc.sequence import Chunk, Sequence
from engine_proc.step.drafter import Drafter

PARKED = SeqSampler(None)  # a parked sequence's: the argmax of its row, not used


class Recorder:
    def __init__(self, runner: ModelRunner, sampler: Sampler, scheduler: Scheduler, drafter: Drafter | None):
        self.runner = runner
        self.sampler = sampler
        self.scheduler = scheduler
        self.drafter = drafter

    def record(
        self,
        chunks: list[Chunk],
        rows: list[int | None],
        tokens: list[int],
        outputs: list[SeqOutput],
        done: list[Sequence],
    ) -> None:
        """Record the run's tokens (``tokens``: those sampled for its sampling chunks, in order), verify its drafts."""
        picked = iter(tokens)
        for chunk, row in zip(chunks, rows):
            seq = chunk.seq
            if seq.parked:  # its token fills the row (see Scheduler.park), its output was sent
                next(picked)
                continue
            if chunk.draft is not None:
                self._verify(chunk, row, outputs, done)
                continue
            seq.n_cached = chunk.end
            if chunk.scores:
                self._score(chunk, row)
            if not chunk.samples:
                continue
            if chunk.scores and seq.params.max_tokens == 0:  # scored, nothing to generate
                out = SeqOutput(seq.id, None, "length")
            else:
                out = self._output(seq, next(picked), row)
            if chunk.start < len(seq.prompt):  # its first output: what the prefix cache served, the prompt's logprobs
                if seq.keeps_logits and row is not None:
                    seq.end_logits = self.sampler.row(row)
                out.cached_tokens = seq.reused
                if chunk.scores:
                    out.prompt_logprobs = seq.prompt_logprobs
            outputs.append(out)
            if out.finish:
                done.append(seq)

    def recall(self, seqs: list[Sequence], outputs: list[SeqOutput], done: list[Sequence]) -> None:
        """The first tokens of sequences the cache served whole (Scheduler.recalled), from the logits it kept."""
        for seq in seqs:
            out = self._output(seq, self.sampler.pick(seq.sampler, seq.end_logits), -1)
            out.cached_tokens = seq.reused
            outputs.append(out)
            if out.finish:
                done.append(seq)
        seqs.clear()

    def _verify(self, chunk: Chunk, last_row: int, outputs: list[SeqOutput], done: list[Sequence]) -> None:
        """Sample row by row while the draft holds: every token is the one the sampler picks on its row.

        Row j follows the draft's first j tokens, so its token is what the
        sequence's own sampler (its seeded draw, grammar and penalties
        included) picks there, whether or not it matches the draft (or a
        remembered token near its pick: Drafter.keeps); it stops at the first
        token that differs from the draft. The cells past the last kept token
        are dropped.
        """
        seq, draft = chunk.seq, chunk.draft
        first = last_row - len(draft)
        for j in range(len(draft) + 1):
            seq.n_cached = chunk.start + j + 1
            row = first + j
            token = self.sampler.sample_rows([seq.sampler], [row])[0]
            want = int(draft[j]) if j < len(draft) else seq.drafting.after  # the earlier answer's, if remembered
            if want >= 0 and token != want and self.drafter.keeps(seq, self.sampler, row, token, want):
                token = want  # a near tie (Drafter.keeps)
            out = self._output(seq, token, row)
            outputs.append(out)
            if out.finish:
                done.append(seq)
                break
            if j == len(draft) or out.token != draft[j]:
                break
        accepted = j + int(j < len(draft) and out.token == draft[j])  # the last row's token may finish on a drafted one
        self.drafter.verified(seq, len(draft), accepted)
        if out.finish:  # with this draft's counts too
            out.drafted, out.accepted = seq.drafting.drafted, seq.drafting.accepted
        if not out.finish and seq.n_cached < chunk.end:
            self.runner.trim(seq.slot, seq.position(seq.n_cached))

    def _output(self, seq: Sequence, token: int, row: int) -> SeqOutput:
        """The sampled token (-1: the sequence's grammar allowed none) recorded, and whether it ends the sequence."""
        if token < 0:  # a dead end: this request ends, the rest go on
            return SeqOutput(seq.id, None, "error")
        is_eog = token in self.runner.eog_tokens
        finish = self.scheduler.finish_reason(seq, token, is_eog)
        if finish == "stop" and is_eog:
            out = SeqOutput(seq.id, None, finish)
        else:
            out = SeqOutput(seq.id, token, finish)
            if seq.params.logprobs is not None:
                out.logprobs = self.sampler.logprobs(row, token, seq.params.logprobs)
        if finish and seq.drafting is not None:
            out.drafted, out.accepted = seq.drafting.drafted, seq.drafting.accepted
        return out

    def _score(self, chunk: Chunk, last_row: int) -> None:
        """The logprobs of the prompt tokens that follow the chunk's: row j predicts token start + j + 1."""
        seq, n = chunk.seq, chunk.end - chunk.start
        k = seq.params.prompt_logprobs
        first = last_row - n + 1
        for j in range(min(n, len(seq.prompt) - 1 - chunk.start)):
            seq.prompt_logprobs.append(self.sampler.logprobs(first + j, int(seq.prompt[chunk.start + j + 1]), k))

    def park(self, done: list[Sequence]) -> None:
        """Steady steps: the decode's finished sequences stay in its batch until the next wave (Scheduler.park);
        their samplers go now, as their outputs have, but for chains on the device: they go when their sequences
        leave (free_parked, for Scheduler.left), since detaching one changes the context's samplers, and llama.cpp
        then builds the next decode's graph anew (staggered c = 32: 66% of decode steps reused it when each
        departure detached its chain). Meanwhile a parked row's token is drawn on the device, and ignored."""
        for seq in done:
            if not seq.sampler.device:
                self.free_parked([seq])
            self.scheduler.park(seq)
        done.clear()

    def free_left(self) -> None:
        """The chains of parked sequences that left (Scheduler.left); only while no decode runs (see park)."""
        if self.scheduler.left:
            self.free_parked(self.scheduler.left)
            self.scheduler.left = []

    def free_parked(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.sampler.free(seq.sampler)
            seq.sampler = PARKED

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.sampler.free(seq.sampler)
            if self.drafter is not None:
                self.drafter.remember(seq)
