"""The engine: one step = schedule (and draft), run (llama_decode, sample, verify drafts), postprocess (retire).

``step()`` yields StepResults: the first tokens of streamed prompts as soon
as their llama_decode call ends (see _prefill_runs), then the step's own
result, with its embeddings and whether the frontend must wake for it.

With steady steps a decode whose batch is known runs one step ahead: it is
launched on the decode thread before the step's last result is yielded, so
the tokens of the decode before are recorded, and written to the ring,
while llama.cpp computes (see _step_ahead).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from msgspec.structs import replace

from cllm.core.config import ServeConfig
from cllm.core.images import ImageError
from cllm.core.protocol import Embed, Embeddings, EngineStats, ModelInfo, SeqOutput, Submit
from engine_proc.disk_cache import fingerprint, identity, open_disk_cache
from engine_proc.drafter import Drafter
from engine_proc.embedder import Embedder
from engine_proc.encoder import Encoder, splice
from engine_proc.model_runner import ModelLoadError, ModelRunner
from engine_proc.sampler import GrammarError, Sampler, SeqSampler
from engine_proc.scheduler import Scheduler
from engine_proc.sequence import Chunk, ImageSpan, Sequence
from engine_proc.slot_files import SlotFiles
from engine_proc.step_timer import StepTimer
from engine_proc.vision import ProjectorError, Vision

# While sequences decode, embeddings get at most this fraction (1/n) of a step's budget.
EMBED_SHARE = 4
# Streamed prompts that end in a step are decoded in groups of at least this
# many tokens, the shortest first, and each group's first tokens are sent
# before the next group runs (see _prefill_runs).
FIRST_TOKEN_GROUP = 48
PARKED = SeqSampler(None)  # a parked sequence's: the argmax of its row, not used


@dataclass(slots=True)
class Ahead:
    """A steady decode that ran ahead of its step: its batch and sampled tokens, not recorded yet."""

    chunks: list[Chunk]
    tokens: list[int]


@dataclass(slots=True)
class StepResult:
    outputs: list[SeqOutput]
    embeddings: list[Embeddings] = field(default_factory=list)
    wake: bool = True  # the frontend wants these now (see step)
    last: bool = True  # the step's own result; earlier ones carry first tokens sent before the step ends


class LLMEngine:
    def __init__(self, model_path: str, config: ServeConfig):
        self.runner = ModelRunner(model_path, config)
        self.vision: Vision | None = None
        image_tokens = 0
        if config.mmproj:
            self.vision, image_tokens = self._projector(config)
        # Sampling on the device: with --device-sampling on, or auto and GPU layers; never beside drafts, whose rows
        # are verified one by one.
        device = config.device_sampling == "on" or (
            config.device_sampling == "auto" and self.runner.info.gpu_layers > 0
        )
        device = device and config.spec_type == "none"
        self.sampler = Sampler(self.runner.ctx, self.runner.vocab, self.runner.n_vocab, self.runner.eog_tokens, device)
        disk = open_disk_cache(model_path, config, self.runner)  # None without --cache-dir
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
            disk,
        )
        # llama-server's slot actions, their files keyed as the disk cache's (with or without --cache-dir)
        r = self.runner
        ident = identity(model_path, config, r.seq_ctx, r.token_budget, r.info.gpu_layers, r.n_streams)
        self.slots = SlotFiles(self.scheduler, self.runner, fingerprint(ident))
        self.drafter = Drafter(config.draft_max, self.runner.seq_ctx) if config.spec_type == "ngram" else None
        # Steady decode batches where a reused graph pays: on a GPU (CUDA graphs), and never beside drafts,
        # whose verification changes the batch's shape every step. On the CPU a parked row costs what a
        # sequence's token does, and a rebuilt graph little (perf/results/2026-11-27-engine-step-cpu.md).
        steady = config.steady_steps == "on" or (config.steady_steps == "auto" and self.runner.info.gpu_layers > 0)
        self.scheduler.steady = steady and self.drafter is None
        self.embedder = Embedder(self.runner)
        self.encoder = Encoder(self.vision) if self.vision is not None else None
        self.info: ModelInfo = replace(
            self.runner.info,
            spec_type=config.spec_type,
            draft_max=config.draft_max,
            embedding_dim=self.embedder.dim,
            max_embedding_tokens=self.embedder.max_tokens,
            mmproj=config.mmproj or "",
            image_tokens=image_tokens,
        )
        self.timer: StepTimer | None = None  # set, it sums the time of each part of every step
        self.steps = 0
        self.decode_steps = 0  # llama_decode calls of decoding sequences' tokens
        self.reused_steps = 0  # of those, the ones whose compute graph llama.cpp reused from the call before
        self.stream_interval = config.stream_interval_ms / 1000
        self._woke = 0.0  # when the last urgent step ended
        self._step_wall = 0.0  # the last step's seconds
        self._ahead: Ahead | None = None  # see _step_ahead
        self._inflight: list[Chunk] | None = None  # the batch of the decode on the decode thread
        self._landed: list[SeqOutput] = []  # outputs of a decode that ran ahead, recorded by abort()
        self.generated_tokens = 0
        # Per-step figures gathered until the next stats(): a float and an int a step.
        self.step_seconds: list[float] = []
        self.batch_sizes: list[int] = []

    def _projector(self, config: ServeConfig) -> tuple[Vision, int]:
        """The projector (--mmproj) loaded beside the model, and the positions one image takes; ModelLoadError
        saying why it cannot serve."""
        try:
            vision = Vision(self.runner.model, config.mmproj, config.n_threads, use_gpu=self.runner.info.gpu_layers > 0)
        except ProjectorError as e:
            self.runner.close()
            raise ModelLoadError(str(e)) from None
        try:
            return vision, vision.image_positions()
        except ProjectorError as e:
            vision.close()
            self.runner.close()
            raise ModelLoadError(f"{config.mmproj}: {e}") from None

    def add(self, req: Submit) -> SeqOutput | None:
        """Queue a request; the output that ends it at once if the engine refuses it."""
        if req.images:  # made ready in the encoder's thread first (see _images_ready)
            if why := self._refuse_images(req):
                return SeqOutput(req.id, finish="error", error=why)
            self.encoder.add(req)
            return None
        return self._queue(req, np.array(req.prompt, np.int32))

    def _refuse_images(self, req: Submit) -> str:
        """Why the engine cannot take the request's images ("": it can). The frontend checks these first."""
        ats = [i.at for i in req.images]
        if self.encoder is None:
            return "this model takes no images: start it with --mmproj (a vision projector)"
        if req.sampling.prompt_logprobs is not None:  # they would score the placeholders of an image's positions
            return "prompt logprobs are not available for a prompt with images"
        if ats != sorted(ats) or not 0 <= ats[0] <= ats[-1] <= len(req.prompt):
            return "the images' places are out of the prompt's order or range"
        return ""

    def _queue(self, req: Submit, prompt: np.ndarray, images: list[ImageSpan] | None = None) -> SeqOutput | None:
        try:
            sampler = self.sampler.new(req.sampling, req.prompt)
        except GrammarError:
            return SeqOutput(req.id, finish="error")
        seq = Sequence(req.id, prompt, req.sampling, sampler, per_step=req.per_step, images=images or [])
        self.scheduler.add(seq)
        return None

    def _images_ready(self, outputs: list[SeqOutput]) -> None:
        """Queue the requests whose images the encoder made ready; end those it could not (a malformed image)."""
        for req, pieces in self.encoder.take():
            if isinstance(pieces, Exception):  # an ImageError's message names the problem; mtmd's codes do not
                why = str(pieces) if isinstance(pieces, ImageError) else f"the image could not be encoded ({pieces})"
                outputs.append(SeqOutput(req.id, finish="error", error=why))
                continue
            prompt, spans = splice(req.prompt, req.images, pieces, self.runner.n_vocab)
            if len(prompt) >= self.runner.seq_ctx:  # the frontend counted image_tokens for each: not expected
                why = f"the prompt with its images takes {len(prompt)} positions, over the {self.runner.seq_ctx - 1} "
                outputs.append(SeqOutput(req.id, finish="error", error=why + "a sequence may"))
                continue
            if (refused := self._queue(req, prompt, spans)) is not None:
                outputs.append(refused)

    def wake_fds(self) -> tuple[int, ...]:
        """What the idle engine waits on besides requests: the encoder's signal that images are ready."""
        return (self.encoder.armed(),) if self.encoder is not None else ()

    def embed(self, req: Embed) -> None:
        self.embedder.add(req)

    def abort(self, ids: list[int]) -> None:
        self._settle()
        gone = set(ids)
        ahead = self._ahead
        if ahead is not None and any(c.seq.id in gone for c in ahead.chunks):  # the batch changes: its tokens first
            self._ahead = None
            self._land(ahead, self._landed)
            self._landed = [o for o in self._landed if o.id not in gone]
        self._release(self.scheduler.remove(gone))
        self.embedder.abort(gone)
        if self.encoder is not None:
            self.encoder.abort(gone)

    def drop_all(self) -> None:
        self.slots.pending.clear()
        self.abort(
            [s.id for s in (*self.scheduler.running, *self.scheduler.waiting)]
            + [j.id for j in self.embedder.jobs]
            + list(self.encoder.pending if self.encoder is not None else ())
        )

    def has_work(self) -> bool:
        """Sequences or embeddings to step, or requests whose images are ready; images still being encoded are not
        (the idle engine waits for them on wake_fds). Outputs an abort recorded go out in a step too."""
        return (
            self.scheduler.has_work()
            or bool(self.embedder.jobs or self._landed)
            or (self.encoder is not None and self.encoder.ready())
        )

    def step(self) -> Iterator[StepResult]:
        """Schedule, run, postprocess: one step. Yields a result for each group of streamed prompts'
        first tokens as it is ready (last=False), then the step's own result (last=True)."""
        timer = self.timer
        if timer:
            timer.start()
        t0 = time.perf_counter()
        self._settle()
        ahead, self._ahead = self._ahead, None
        images = self.encoder is not None and bool(self.encoder.pending)
        ready = images and self.encoder.ready()  # requests whose images are ready start in a wave
        if ahead is not None and not (self.embedder.jobs or ready) and min(ahead.tokens) >= 0:
            chunks = self.scheduler.go_on(ahead.chunks)
            if chunks is not None:
                yield from self._step_ahead(ahead, chunks, t0)
                return
        # The decode that ran ahead was this step's: its tokens are recorded first, as a steady step's decode's are.
        outputs, self._landed = self._landed, []
        parked = sum(o.finish is not None for o in outputs)  # sequences that finished in a steady decode
        if ahead is not None:
            parked += self._land(ahead, outputs)
        refused = len(outputs)
        if images:
            self._images_ready(outputs)
        refused = len(outputs) > refused
        step = self.scheduler.schedule()
        # Drafts only in steps without prompt work: those are compute-bound already.
        drafting = self.drafter is not None and bool(step.decode) and not step.prefill
        if drafting:
            self.drafter.draft(step.decode, self.runner.token_budget - len(step.decode))
        if timer:
            timer.lap("schedule")
        done: list[Sequence] = []
        steady = self.scheduler.steady
        if steady:  # the decode first, in the shape of the step before; then the wave's admissions (Scheduler.wave)
            if step.decode and ahead is None:
                self._run(step.decode, outputs, done, plain=True)
                self._count_decode()
                parked += len(done)
                self._park(done)
            step.prefill += self.scheduler.wave()
            if timer:
                timer.lap("schedule")
        first, later = self._prefill_runs(step.prefill)
        for chunks in first:  # their tokens go now: see _prefill_runs
            sent: list[SeqOutput] = []
            self._run(chunks, sent, done)
            self.generated_tokens += len(sent)
            if timer:
                timer.lap("other")
            yield StepResult(sent, last=False)
            if timer:
                timer.start()
        if step.decode and not steady:
            t_decode = time.perf_counter()
            self._run(step.decode, outputs, done, plain=not drafting)
            self._count_decode()
            if drafting:
                self.drafter.end_step(len(step.decode), time.perf_counter() - t_decode)
        for chunks in later:
            self._run(chunks, outputs, done)
        if done:
            self._release(self.scheduler.remove({s.id for s in done}))
            if timer:
                timer.lap("retire")
        embeddings: list[Embeddings] = []
        if self.embedder.jobs:  # in what the generation left of the budget
            used = len(step.decode) + sum(c.end - c.start for c in step.prefill)
            budget = self.runner.token_budget - used
            if step.decode:  # embedding is prefill work: a full budget of it beside decoding streams slows them ~15x
                budget = min(budget, self.runner.token_budget // EMBED_SHARE)
            embeddings = self.embedder.step(budget)
        t1 = time.perf_counter()
        # The last parked sequences may leave in a step of their own: the engine's final figures go with it.
        urgent = bool(done or parked or refused) or any(c.samples for c in step.prefill) or not self.has_work()
        wake = self._wake(urgent, step.decode, t1 - t0, t1)
        self.steps += 1
        self.generated_tokens += len(outputs)
        self.batch_sizes.append(len(step.decode) + len({id(c.seq) for c in step.prefill}))
        if timer:
            timer.lap("other")
        chunks = self._next_decode() if steady else None
        if chunks is None:
            self._step_wall = t1 - t0
            self.step_seconds.append(t1 - t0)
            yield StepResult(outputs, embeddings, wake)
            return
        self._launch(chunks)
        if timer:
            timer.lap("batch")
        yield StepResult(outputs, embeddings, wake)
        if timer:
            timer.start()
        self._collect(chunks, t0)

    def _wake(self, urgent: bool, decode: list[Chunk], took: float, now: float) -> bool:
        """Whether the frontend wants this step's outputs now: if a request begins (its first token
        times TTFT) or ends (``urgent``). A token read as it comes (per_step) may wait in the
        ring while the next step, if it takes as long as this one (``took``), still ends
        within the stream interval of the last wake-up: one wake-up of the
        frontend then carries a few tokens, and its CPU goes to llama.cpp."""
        if urgent or (any(c.seq.per_step for c in decode) and now + took - self._woke >= self.stream_interval):
            self._woke = now
            return True
        return False

    def _next_decode(self) -> list[Chunk] | None:
        """A steady step's next decode batch, when it is known before the step's result goes out: no prompt
        work waits, and no sequence asks for logprobs (read from the logits the decode ahead overwrites)."""
        if self.sampler.device or self.embedder.jobs:
            return None
        running = self.scheduler.running
        if not running or any(s.prefilling or s.params.logprobs is not None for s in running):
            return None
        return self.scheduler.decode_batch()

    def _step_ahead(self, ahead: Ahead, chunks: list[Chunk], t0: float) -> Iterator[StepResult]:
        """A steady step whose decode batch is the one before it a position on (Scheduler.go_on).

        On the step's critical path: the batch written and launched on the
        decode thread, and, after the result is out, the wait for it and its
        sampling. Meanwhile, while llama.cpp computes, the tokens of the decode
        before are recorded (finish checks, outputs; the finished parked) and
        the step's result goes to the ring. A sequence that finished on its
        last token is still in the batch launched: it decodes a token more,
        which a parked sequence does anyway (Scheduler.park).
        """
        timer = self.timer
        tokens = [c.seq.output[-1] if c.seq.parked else t for c, t in zip(chunks, ahead.tokens)]
        if timer:
            timer.lap("schedule")
        self._launch(chunks, tokens)
        if timer:
            timer.lap("batch")
        outputs: list[SeqOutput] = []
        parked = self._land(ahead, outputs)
        t1 = time.perf_counter()
        wake = self._wake(bool(parked), chunks, self._step_wall, t1)
        self.steps += 1
        self.generated_tokens += len(outputs)
        self.batch_sizes.append(len(chunks))
        if timer:
            timer.lap("overlapped")
        yield StepResult(outputs, [], wake)
        if timer:
            timer.start()
        self._collect(chunks, t0)

    def _launch(self, chunks: list[Chunk], tokens: list[int] | None = None) -> None:
        self.runner.fill(chunks, True, tokens)
        self.runner.launch()
        self._inflight = chunks

    def _settle(self) -> None:
        """A decode launched by a step that was left before its end (the process stopping) ends before the
        context is used again."""
        if self._inflight is not None:
            self._collect(self._inflight, time.perf_counter())

    def _collect(self, chunks: list[Chunk], t0: float) -> None:
        """Wait for the decode launched ahead and sample its rows: the next step records the tokens."""
        timer = self.timer
        self._inflight = None
        self.runner.wait()
        if timer:
            timer.lap("llama_decode")
        self._count_decode()
        tokens = self.sampler.sample_rows([c.seq.sampler for c in chunks], list(range(-len(chunks), 0)))
        self._ahead = Ahead(chunks, tokens)
        self._step_wall = time.perf_counter() - t0
        self.step_seconds.append(self._step_wall)
        if timer:
            timer.lap("sampling")

    def _land(self, ahead: Ahead, outputs: list[SeqOutput]) -> int:
        """Record the tokens of the decode that ran ahead; its finished sequences are parked. How many finished."""
        done: list[Sequence] = []
        self._postprocess(ahead.chunks, list(range(-len(ahead.chunks), 0)), ahead.tokens, outputs, done)
        finished = len(done)
        self._park(done)
        return finished

    def _count_decode(self) -> None:
        self.decode_steps += 1
        self.reused_steps += self.runner.reused

    def _park(self, done: list[Sequence]) -> None:
        """Steady steps: the decode's finished sequences stay in its batch until the next wave (Scheduler.park);
        their samplers go now, as their outputs have."""
        for seq in done:
            self.sampler.free(seq.sampler)
            seq.sampler = PARKED
            self.scheduler.park(seq)
        done.clear()

    def _prefill_runs(self, chunks: list[Chunk]) -> tuple[list[list[Chunk]], list[list[Chunk]]]:
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
        alone = [[c] for c in chunks if self.scheduler.exact or c.scores or c.image is not None]
        shared = [c for c in chunks if not (self.scheduler.exact or c.scores or c.image is not None)]
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

    def _run(self, chunks: list[Chunk], outputs: list[SeqOutput], done: list[Sequence], plain: bool = False) -> None:
        """One llama_decode, then a token for each chunk that ends its sequence's known tokens.

        ``plain``: the chunks are the decode batch without drafts (see Batch.fill).
        """
        timer = self.timer
        if self.sampler.device:
            for c in chunks:
                if c.samples:
                    self.sampler.attach(c.seq.sampler, c.seq.slot)
        if chunks[0].image is not None:  # alone in its call (see _prefill_runs)
            c = chunks[0]
            rows: list[int | None] = [-1 if c.samples else None]
            image = c.image.rows[c.start - c.image.start : c.end - c.image.start]
            self.runner.decode_rows(image, c.start, c.seq.slot, c.samples)
        else:
            rows = self.runner.fill(chunks, plain)
            if timer:
                timer.lap("batch")
            self.runner.decode()
        if timer:  # on a GPU the wait would otherwise count as sampling, where the outputs are first read
            self.runner.synchronize()
            timer.lap("llama_decode")
        if plain:
            tokens = self.sampler.sample_rows([c.seq.sampler for c in chunks], rows)
        else:  # for the chunks _postprocess takes a sampled token for
            picks = [
                (c.seq.sampler, row)
                for c, row in zip(chunks, rows)
                if c.draft is None and c.samples and not (c.scores and c.seq.params.max_tokens == 0)
            ]
            tokens = self.sampler.sample_rows([s for s, _ in picks], [row for _, row in picks]) if picks else []
        if timer:
            timer.lap("sampling")
        self._postprocess(chunks, rows, tokens, outputs, done)
        if timer:
            timer.lap("retire")

    def _postprocess(
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
            out = self._output(seq, self.sampler.sample_rows([seq.sampler], [first + j])[0], first + j)
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

    def _output(self, seq: Sequence, token: int, row: int) -> SeqOutput:
        """The sampled token (-1: the sequence's grammar allowed none) recorded, and whether it ends the sequence."""
        if token < 0:  # a dead end: this request ends, the rest go on
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

    def persist_wait(self) -> float | None:
        """Seconds the idle engine may wait before persist has work (None: as long as it likes)."""
        return self.scheduler.cache.persist_wait() if self.scheduler.cache is not None else None

    def persist(self) -> bool:
        """The idle engine's cache and its disk (--cache-dir): entries go to files, files found at the start
        into empty streams; whether its figures changed."""
        cache = self.scheduler.cache
        return cache is not None and cache.persist(self.runner) | self.scheduler.warm()

    def stats(self) -> EngineStats:
        """Current figures, and the per-step ones gathered since the last call."""
        running = self.scheduler.running
        stats = EngineStats(
            running=len(running) - self.scheduler.parked,
            waiting=len(self.scheduler.waiting),
            kv_used=sum(s.n_cached for s in running),
            steps=self.steps,
            decode_steps=self.decode_steps,
            reused_steps=self.reused_steps,
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
        self._settle()
        self.drop_all()
        if self.scheduler.cache is not None:  # what the streams hold goes to disk (--cache-dir)
            self.scheduler.cache.close(self.runner)
        self.embedder.close()
        if self.encoder is not None:
            self.encoder.close()
        if self.vision is not None:
            self.vision.close()
        self.runner.close()
