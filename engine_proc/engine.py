"""The engine: one step = schedule (and draft), run (llama_decode, sample), postprocess (record, retire).

``step()`` yields StepResults: the first tokens of streamed prompts as soon
as their llama_decode call ends (engine_proc/run/prefill_runs.py), then the step's own
result, with its embeddings and whether the frontend must wake for it.

The parts live beside it: the tokens recorded (engine_proc/step/recorder.py),
requests with images made ready (engine_proc/vision/image_intake.py), and with
steady steps the decode run one step ahead, its tokens recorded, and
written to the ring, while llama.cpp computes (engine_proc/step/ahead.py,
run by _step_ahead).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from msgspec.structs import replace

from cllm.core.config import ServeConfig
from cllm.core.protocol import Embed, Embeddings, EngineStats, ModelInfo, SeqOutput, SlotDone, Submit
from engine_proc.kv.disk_cache import fingerprint, identity, open_disk_cache
from engine_proc.kv.slot_files import SlotFiles
from engine_proc.run.embedder import Embedder
from engine_proc.run.model_runner import ModelRunner
from engine_proc.run.prefill_runs import prefill_runs
from engine_proc.sampling.sampler import GrammarError, Sampler
from engine_proc.scheduler import Scheduler
from engine_proc.sequence import Chunk, ImageSpan, Sequence
from engine_proc.step.ahead import Ahead, StepAhead
from engine_proc.step.drafter import make_drafter
from engine_proc.step.recorder import Recorder
from engine_proc.step.timer import StepTimer

if TYPE_CHECKING:
    from engine_proc.vision.image_intake import ImageIntake

NO_PROJECTOR = "this model takes no images: start it with --mmproj (a vision projector)"
# While sequences decode, embeddings get at most this fraction (1/n) of a step's budget.
EMBED_SHARE = 4
# Streams in a step from which their tokens may wait for the next ones, where llama.cpp's threads fill the CPUs
# (docs/internals.md: Streaming); fewer get a token an event.
COALESCE_STREAMS = 4


@dataclass(slots=True)
class StepResult:
    outputs: list[SeqOutput]
    embeddings: list[Embeddings] = field(default_factory=list)
    wake: bool = True  # the frontend wants these now (see step)
    last: bool = True  # the step's own result; earlier ones carry first tokens sent before the step ends


class LLMEngine:
    def __init__(self, model_path: str, config: ServeConfig, server: int | None = None):
        self.runner = ModelRunner(model_path, config, server)  # server: see ModelRunner
        self.images: ImageIntake | None = None
        if config.mmproj:  # engine_proc/vision/ is imported only here: a text model's engine loads none of it
            from engine_proc.vision.image_intake import ImageIntake

            self.images = ImageIntake(self.runner, config)
        self.vision = self.images.vision if self.images is not None else None  # the projector, for tests and tools
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
        self.slots = SlotFiles(config.parallel, self.scheduler.cache, self.runner, fingerprint(ident))
        self.drafter = make_drafter(config, model_path, self.runner.seq_ctx)
        # Steady decode batches where a reused graph pays: on a GPU (CUDA graphs), and never beside drafts,
        # whose verification changes the batch's shape every step. On the CPU a parked row costs what a
        # sequence's token does, and a rebuilt graph little (perf/results/2026-11-27-engine-step-cpu.md).
        steady = config.steady_steps == "on" or (config.steady_steps == "auto" and self.runner.info.gpu_layers > 0)
        self.scheduler.steady = steady and self.drafter is None
        self.embedder = Embedder(self.runner)
        self.recorder = Recorder(self.runner, self.sampler, self.scheduler, self.drafter)
        self.lookahead = StepAhead(self.runner, self.sampler, self.scheduler, self.recorder)
        self.info: ModelInfo = replace(
            self.runner.info,
            spec_type=config.spec_type,
            draft_max=config.draft_max,
            embedding_dim=self.embedder.dim,
            max_embedding_tokens=self.embedder.max_tokens,
            mmproj=config.mmproj or "",
            image_tokens=self.images.image_tokens if self.images is not None else 0,
            image_grid=self.images.image_grid if self.images is not None else None,
        )
        self.timer: StepTimer | None = None  # set, it sums the time of each part of every step
        self.steps = 0
        self.decode_steps = 0  # llama_decode calls of decoding sequences' tokens
        self.reused_steps = 0  # of those, the ones whose compute graph llama.cpp reused from the call before
        self.stream_interval = config.stream_interval_ms / 1000
        cpu_bound = self.runner.info.gpu_layers == 0 and self.runner.threads.most >= (os.cpu_count() or 1)
        self.coalesce_streams = COALESCE_STREAMS if cpu_bound else float("inf")
        self._woke = 0.0  # when the frontend was last woken
        self._step_wall = 0.0  # the last step's seconds
        self.generated_tokens = 0
        # Per-step figures gathered until the next stats(): a float and an int a step.
        self.step_seconds: list[float] = []
        self.batch_sizes: list[int] = []

    def add(self, req: Submit) -> SeqOutput | None:
        """Queue a request; the output that ends it at once if the engine refuses it."""
        if req.images:  # made ready in the encoder's thread first, queued by a step once they are
            if why := self.images.refuse(req) if self.images is not None else NO_PROJECTOR:
                return SeqOutput(req.id, finish="error", error=why)
            self.images.encoder.add(req)
            return None
        return self._queue(req, np.array(req.prompt, np.int32))

    def _queue(self, req: Submit, prompt: np.ndarray, images: list[ImageSpan] | None = None) -> SeqOutput | None:
        try:
            sampler = self.sampler.new(req.sampling, req.prompt)
        except GrammarError:
            return SeqOutput(req.id, finish="error")
        seq = Sequence(
            req.id, prompt, req.sampling, sampler, per_step=req.per_step, images=images or [], scope=req.scope
        )
        self.scheduler.add(seq)
        return None

    def wake_fds(self) -> tuple[int, ...]:
        """What the idle engine waits on besides requests: the encoder's signal that images are ready."""
        return (self.images.encoder.armed(),) if self.images is not None else ()

    def embed(self, req: Embed) -> None:
        self.embedder.add(req)

    def abort(self, ids: list[int]) -> None:
        self._settle()
        gone = set(ids)
        self.lookahead.abort(gone)
        self.recorder.release(self.scheduler.remove(gone))
        self.embedder.abort(gone)
        if self.images is not None:
            self.images.encoder.abort(gone)

    def drop_all(self) -> None:
        self.slots.pending.clear()
        self.abort(
            [s.id for s in (*self.scheduler.running, *self.scheduler.waiting)]
            + [j.id for j in self.embedder.jobs]
            + list(self.images.encoder.pending if self.images is not None else ())
        )

    def has_work(self) -> bool:
        """Sequences or embeddings to step, or requests whose images are ready; images still being encoded are not
        (the idle engine waits for them on wake_fds). Outputs an abort recorded go out in a step too."""
        return (
            self.scheduler.has_work()
            or bool(self.embedder.jobs or self.lookahead.landed)
            or (self.images is not None and self.images.encoder.ready())
        )

    def step(self) -> Iterator[StepResult]:
        """Schedule, run, postprocess: one step. Yields a result for each group of streamed prompts'
        first tokens as it is ready (last=False), then the step's own result (last=True)."""
        timer = self.timer
        if timer:
            timer.start()
        t0 = time.perf_counter()
        self._settle()
        ahead, self.lookahead.ahead = self.lookahead.ahead, None
        images = self.images is not None and bool(self.images.encoder.pending)
        ready = images and self.images.encoder.ready()  # requests whose images are ready start in a wave
        following = self.lookahead.go_on(ahead) if ahead is not None and not (self.embedder.jobs or ready) else None
        if following is not None:
            yield from self._step_ahead(ahead, *following, t0)
            return
        # The decode that ran ahead was this step's: its tokens are recorded first, as a steady step's decode's are.
        outputs, self.lookahead.landed = self.lookahead.landed, []
        parked = sum(o.finish is not None for o in outputs)  # sequences that finished in a steady decode
        if ahead is not None:
            parked += self.lookahead.land(ahead, outputs)
        refused = len(outputs)
        if images:
            for req, prompt, spans in self.images.take(outputs):
                if (error := self._queue(req, prompt, spans)) is not None:
                    outputs.append(error)
        refused = len(outputs) > refused
        step = self.scheduler.schedule()
        self.recorder.free_left()
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
                self.recorder.park(done)
            step.prefill += self.scheduler.wave()
            self.recorder.free_left()
            if timer:
                timer.lap("schedule")
        first, later = prefill_runs(step.prefill, self.scheduler.exact)
        for chunks in first:  # their tokens go now: see prefill_runs
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
            self.recorder.release(self.scheduler.remove({s.id for s in done}))
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
        chunks = self.lookahead.next_decode(bool(self.embedder.jobs)) if steady else None
        if chunks is None:
            self._step_wall = t1 - t0
            self.step_seconds.append(t1 - t0)
            yield StepResult(outputs, embeddings, wake)
            return
        self.lookahead.launch(chunks)
        if timer:
            timer.lap("batch")
        yield StepResult(outputs, embeddings, wake)
        if timer:
            timer.start()
        self._collect(t0)

    def _wake(self, urgent: bool, decode: list[Chunk], took: float, now: float) -> bool:
        """Whether the frontend wants this step's outputs now: if a request begins (its first token
        times TTFT) or ends (``urgent``), or a token read as it comes (per_step) is in it. With
        coalesce_streams or more of those, they may wait in the ring while the next step, if as
        long as this one (``took``), still ends within the stream interval of the last wake-up."""
        if not urgent:
            streams = sum(c.seq.per_step for c in decode)
            if not streams or (streams >= self.coalesce_streams and now + took - self._woke < self.stream_interval):
                return False
        self._woke = now
        return True

    def _step_ahead(self, ahead: Ahead, chunks: list[Chunk], tokens: list[int], t0: float) -> Iterator[StepResult]:
        """A steady step whose decode batch is the one before it a position on (StepAhead.go_on).

        On the step's critical path: the batch written and launched on the
        decode thread, and, after the result is out, the wait for it and its
        sampling. Meanwhile, while llama.cpp computes, the tokens of the decode
        before are recorded (finish checks, outputs; the finished parked) and
        the step's result goes to the ring. A sequence that finished on its
        last token is still in the batch launched: it decodes a token more,
        which a parked sequence does anyway (Scheduler.park).
        """
        timer = self.timer
        if timer:
            timer.lap("schedule")
        self.lookahead.launch(chunks, tokens)
        if timer:
            timer.lap("batch")
        outputs: list[SeqOutput] = []
        parked = self.lookahead.land(ahead, outputs)
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
        self._collect(t0)

    def _settle(self) -> None:
        """A decode launched by a step that was left before its end (the process stopping) ends before the
        context is used again."""
        if self.lookahead.inflight is not None:
            self._collect(time.perf_counter())

    def _collect(self, t0: float) -> None:
        """Wait for the decode launched ahead and sample its rows (StepAhead.collect); the step's figures."""
        self.lookahead.collect(self.timer)
        self._count_decode()
        self._step_wall = time.perf_counter() - t0
        self.step_seconds.append(self._step_wall)
        if self.timer:
            self.timer.lap("sampling")

    def _count_decode(self) -> None:
        self.decode_steps += 1
        self.reused_steps += self.runner.reused

    def _run(self, chunks: list[Chunk], outputs: list[SeqOutput], done: list[Sequence], plain: bool = False) -> None:
        """One llama_decode, then a token for each chunk that ends its sequence's known tokens.

        ``plain``: the chunks are the decode batch without drafts (see Batch.fill).
        """
        timer = self.timer
        if self.sampler.device:
            for c in chunks:
                if c.samples:
                    self.sampler.attach(c.seq.sampler, c.seq.slot)
        if chunks[0].image is not None:  # alone in its call (engine_proc/run/prefill_runs.py)
            c = chunks[0]
            rows: list[int | None] = [-1 if c.samples else None]
            k0, k1 = c.start - c.image.start, c.end - c.image.start
            pos = c.image.positions(k0, k1, c.seq.position(c.image.start))
            self.runner.decode_rows(c.image.rows[k0:k1], pos, c.seq.slot, c.samples, c.image.non_causal)
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
        else:  # for the chunks Recorder.record takes a sampled token for
            picks = [
                (c.seq.sampler, row)
                for c, row in zip(chunks, rows)
                if c.draft is None and c.samples and not (c.scores and c.seq.params.max_tokens == 0)
            ]
            tokens = self.sampler.sample_rows([s for s, _ in picks], [row for _, row in picks]) if picks else []
        if timer:
            timer.lap("sampling")
        self.recorder.record(chunks, rows, tokens, outputs, done)
        if timer:
            timer.lap("retire")

    def slot_actions(self) -> list[SlotDone]:
        """The pending slot actions whose streams no sequence runs in, done (SlotFiles.run)."""
        return self.slots.run({s.slot for s in self.scheduler.running})

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
            stats.drafted_tokens, stats.accepted_tokens, stats.drafts = d.drafted, d.accepted, d.drafts
            stats.step_drafted, stats.step_accepted = d.step_drafted, d.step_accepted
            d.step_drafted, d.step_accepted = [], []
        self.step_seconds, self.batch_sizes = [], []
        return stats

    def close(self) -> None:
        self._settle()
        self.drop_all()
        if self.scheduler.cache is not None:  # what the streams hold goes to disk (--cache-dir)
            self.scheduler.cache.close(self.runner)
        if self.drafter is not None:
            self.drafter.close()
        self.embedder.close()
        if self.images is not None:
            self.images.close()
        self.runner.close()
