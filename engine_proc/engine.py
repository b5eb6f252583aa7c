"""The engine: one step = schedule, draft, decode, sample (and verify drafts), retire."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from cllm.core.config import ServeConfig
from cllm.core.protocol import Embed, Embeddings, EngineStats, SeqOutput, Submit
from engine_proc.drafter import Drafter
from engine_proc.embedder import Embedder
from engine_proc.model_runner import ModelRunner
from engine_proc.sampler import GrammarError, Sampler
from engine_proc.scheduler import Scheduler
from engine_proc.sequence import Chunk, Sequence


# While sequences decode, embeddings get at most this fraction (1/n) of a step's budget.
EMBED_SHARE = 4
# Streamed prompts that end in a step are decoded in groups of at least this
# many tokens, the shortest first, and each group's first tokens are sent
# before the next group runs (see _prefill_runs).
FIRST_TOKEN_GROUP = 48


class LLMEngine:
    def __init__(self, model_path: str, config: ServeConfig):
        self.runner = ModelRunner(model_path, config)
        self.sampler = Sampler(self.runner.ctx, self.runner.vocab, self.runner.n_vocab, self.runner.eog_tokens)
        self.scheduler = Scheduler(
            config.parallel,
            config.kv_streams,
            self.runner.token_budget,
            self.runner.seq_ctx,
            self.runner,
            config.prefix_cache,
            config.prefix_cache_exact,
            config.cache_ram << 20,
            config.admit_per_step,
        )
        self.drafter = Drafter(config.draft_max, self.runner.seq_ctx) if config.spec_type == "ngram" else None
        self.runner.info.spec_type, self.runner.info.draft_max = config.spec_type, config.draft_max
        self.embedder = Embedder(self.runner)
        self.runner.info.embedding_dim = self.embedder.dim
        self.runner.info.max_embedding_tokens = self.embedder.max_tokens
        self.embedded: list[Embeddings] = []  # vectors of the last step: the caller sends them
        # Sends outputs ready before the step ends (first tokens); unset, they are step()'s too.
        self.emit: Callable[[list[SeqOutput]], None] | None = None
        self.steps = 0
        self.urgent = True  # the last step's outputs are wanted at once (see step)
        self.stream_interval = config.stream_interval_ms / 1000
        self._woke = 0.0  # when the last urgent step ended
        self.generated_tokens = 0
        # Per-step figures gathered until the next stats(): a float and an int a step.
        self.step_seconds: list[float] = []
        self.batch_sizes: list[int] = []

    def add(self, req: Submit) -> SeqOutput | None:
        """Queue a request; the output that ends it at once if the engine refuses it."""
        try:
            sampler = self.sampler.new(req.sampling, req.prompt)
        except GrammarError:
            return SeqOutput(req.id, finish="error")
        self.scheduler.add(Sequence(req.id, np.array(req.prompt, np.int32), req.sampling, sampler, per_step=req.per_step))
        return None

    def embed(self, req: Embed) -> None:
        self.embedder.add(req)

    def abort(self, ids: list[int]) -> None:
        self._release(self.scheduler.remove(set(ids)))
        self.embedder.abort(set(ids))

    def drop_all(self) -> None:
        self.abort([s.id for s in (*self.scheduler.running, *self.scheduler.waiting, *self.embedder.jobs)])

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self.embedder.jobs)

    def step(self) -> list[SeqOutput]:
        t0 = time.perf_counter()
        step = self.scheduler.schedule()
        outputs: list[SeqOutput] = []
        done: list[Sequence] = []
        first, later = self._prefill_runs(step.prefill)
        for chunks in first:  # their tokens are sent now: see _prefill_runs
            sent: list[SeqOutput] = []
            self._run(chunks, sent, done)
            self.generated_tokens += len(sent)
            self.emit(sent)
        if step.decode:
            # Drafts only in steps without prompt work: those are compute-bound already.
            drafting = self.drafter is not None and not step.prefill
            if drafting:
                self.drafter.draft(step.decode, self.runner.token_budget - len(step.decode))
            t_decode = time.perf_counter()
            self._run(step.decode, outputs, done)
            if drafting:
                self.drafter.end_step(len(step.decode), time.perf_counter() - t_decode)
        for chunks in later:
            self._run(chunks, outputs, done)
        if done:
            self._release(self.scheduler.remove({s.id for s in done}))
        self.embedded = []
        if self.embedder.jobs:  # in what the generation left of the budget
            used = len(step.decode) + sum(c.end - c.start for c in step.prefill)
            budget = self.runner.token_budget - used
            if step.decode:  # embedding is prefill work: a full budget of it beside decoding streams slows them ~15x
                budget = min(budget, self.runner.token_budget // EMBED_SHARE)
            self.embedded = self.embedder.step(budget)
        # The frontend wants this step now if a request begins (its first token
        # times TTFT) or ends. A token read as it comes (per_step) may wait in the
        # ring while the next step, if it takes as long as this one, still ends
        # within the stream interval of the last wake-up: one wake-up of the
        # frontend then carries a few tokens, and its CPU goes to llama.cpp.
        t1 = time.perf_counter()
        streams = any(c.seq.per_step for c in step.decode)
        self.urgent = (
            bool(done)
            or any(c.samples for c in step.prefill)
            or (streams and 2 * t1 - t0 - self._woke >= self.stream_interval)
        )
        if self.urgent:
            self._woke = t1
        self.steps += 1
        self.generated_tokens += len(outputs)
        self.step_seconds.append(t1 - t0)
        self.batch_sizes.append(len(step.decode) + len({id(c.seq) for c in step.prefill}))
        return outputs

    def _prefill_runs(self, chunks: list[Chunk]) -> tuple[list[list[Chunk]], list[list[Chunk]]]:
        """The step's prompt chunks as llama_decode calls: those to run before the decode batch, and after it.

        Chunks share a call (tiny calls cost a few percent more), but for
        exact mode's blocks and scored chunks (every row's logits), which
        alone may be several of one sequence's. A burst of streamed turns
        would otherwise all wait for the whole burst's prefill and the decode
        batch: 6 prompts of 27 tokens took 494 ms in one call here, and as
        three calls of two 501 ms in all, their first tokens coming after
        338 ms on average. So with an emit, the streamed prompts that end in
        this step (a shared chunk is its sequence's only one this step) go
        first, shortest first, in calls of at least FIRST_TOKEN_GROUP tokens,
        and each call's tokens are sent at once. The decode batch's tokens
        are sent when the step ends either way.
        """
        if not chunks:
            return [], []
        by_slot = lambda c: c.seq.slot  # noqa: E731
        alone = [[c] for c in chunks if self.scheduler.exact or c.scores]
        shared = [c for c in chunks if not (self.scheduler.exact or c.scores)]
        first: list[list[Chunk]] = []
        if self.emit is not None:
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

    def _run(self, chunks: list[Chunk], outputs: list[SeqOutput], done: list[Sequence]) -> None:
        """One llama_decode, then a token for each chunk that ends its sequence's known tokens."""
        rows = self.runner.decode(chunks)
        for chunk, row in zip(chunks, rows):
            seq = chunk.seq
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
                out = self._sample(seq, row)
            if chunk.start < len(seq.prompt):  # its first output: what the prefix cache served, the prompt's logprobs
                out.cached_tokens = seq.reused
                if chunk.scores:
                    out.prompt_logprobs = seq.prompt_logprobs
            outputs.append(out)
            if out.finish:
                done.append(seq)

    def _verify(self, chunk: Chunk, last_row: int, outputs: list[SeqOutput], done: list[Sequence]) -> None:
        """Sample row by row while the draft holds: every token is the one the sampler picks on its row.

        Row j follows the draft's first j tokens, so its token is what the
        sequence's own sampler (its seeded draw, grammar and penalties
        included) picks there, whether or not it matches the draft; it stops
        at the first token that differs from the draft. The cells past the
        last kept token are dropped.
        """
        seq, draft = chunk.seq, chunk.draft
        first = last_row - len(draft)
        for j in range(len(draft) + 1):
            seq.n_cached = chunk.start + j + 1
            out = self._sample(seq, first + j)
            outputs.append(out)
            if out.finish:
                done.append(seq)
                break
            if j == len(draft) or out.token != draft[j]:
                break
        accepted = j + int(j < len(draft) and out.token == draft[j])  # the last row's token may finish on a drafted one
        self.drafter.verified(seq, len(draft), accepted)
        if not out.finish and seq.n_cached < chunk.end:
            self.runner.trim(seq.slot, seq.n_cached)

    def _sample(self, seq: Sequence, row: int) -> SeqOutput:
        """The sequence's next token from the row, recorded, and whether it ends the sequence."""
        try:
            token = self.sampler.sample(seq.sampler, row)
        except GrammarError:  # a dead end: this request ends, the rest go on
            return SeqOutput(seq.id, None, "error")
        is_eog = token in self.runner.eog_tokens
        finish = self.scheduler.finish_reason(seq, token, is_eog)
        if finish == "stop" and is_eog:
            return SeqOutput(seq.id, None, finish)
        if seq.params.logprobs is None:
            return SeqOutput(seq.id, token, finish)
        return SeqOutput(seq.id, token, finish, self.sampler.logprobs(row, token, seq.params.logprobs))

    def _score(self, chunk: Chunk, last_row: int) -> None:
        """The logprobs of the prompt tokens that follow the chunk's: row j predicts token start + j + 1."""
        seq, n = chunk.seq, chunk.end - chunk.start
        k = seq.params.prompt_logprobs
        first = last_row - n + 1
        for j in range(min(n, len(seq.prompt) - 1 - chunk.start)):
            seq.prompt_logprobs.append(self.sampler.logprobs(first + j, int(seq.prompt[chunk.start + j + 1]), k))

    def _release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.sampler.free(seq.sampler)

    def stats(self) -> EngineStats:
        """Current figures, and the per-step ones gathered since the last call."""
        running = self.scheduler.running
        stats = EngineStats(
            running=len(running),
            waiting=len(self.scheduler.waiting),
            kv_used=sum(s.n_cached for s in running),
            steps=self.steps,
            generated_tokens=self.generated_tokens,
            step_seconds=self.step_seconds,
            batch_sizes=self.batch_sizes,
            threads=self.runner.threads.n,
        )
        if self.scheduler.cache is not None:
            stats.prefix_cache = self.scheduler.cache.stats()
        if self.drafter is not None:
            d = self.drafter
            stats.drafted_tokens, stats.accepted_tokens = d.drafted, d.accepted
            stats.step_drafted, stats.step_accepted = d.step_drafted, d.step_accepted
            d.step_drafted, d.step_accepted = [], []
        self.step_seconds, self.batch_sizes = [], []
        return stats

    def close(self) -> None:
        self.drop_all()
        self.embedder.close()
        self.runner.close()
