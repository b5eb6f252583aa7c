"""The engine: one step = schedule, run (llama_decode, sample), record, retire.

``step()`` yields StepResults: the first tokens of streamed prompts as soon
as their llama_decode call ends (engine_proc/run/prefill_runs.py), then the step's own
result, with its embeddings and whether the frontend must wake for it.

Its parts are plugged in where they apply: how the decode batch runs
(engine_proc/step/decoding.py: plainly, with drafts, or in steady steps one
step ahead), requests with images (engine_proc/step/images.py; with a
projector, engine_proc/vision/), embeddings (engine_proc/run/embedder.py)
and the step timer (engine_proc/step/timer.py). A run's tokens are recorded
by engine_proc/step/runs.py and engine_proc/step/recorder.py.
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
from cllm.core.protocol import (
    Embed,
    Embeddings,
    EngineStats,
    LoraDone,
    LoraLoad,
    ModelInfo,
    SeqOutput,
    SlotDone,
    Submit,
)
from engine_proc.kv.disk_cache import fingerprint, identity, open_disk_cache
from engine_proc.kv.slot_files import SlotFiles
from engine_proc.run.embedder import Embedder, check_rank_head
from engine_proc.run.lora import LoraError, make_adapters, request_set
from engine_proc.run.model_runner import ModelRunner
from engine_proc.run.prefill_runs import prefill_runs
from engine_proc.sampling.sampler import GrammarError, Sampler
from engine_proc.scheduler import Scheduler, SchedulerSettings, Step
from engine_proc.sequence import Chunk, ImageSpan, Sequence
from engine_proc.step.ahead import Ahead, StepAhead
from engine_proc.step.decoding import Decoding, PlainDecoding, SteadyDecoding, Turn
from engine_proc.step.drafter import make_drafter
from engine_proc.step.images import Images, NoImages
from engine_proc.step.recorder import Recorder
from engine_proc.step.runs import Runs
from engine_proc.step.timer import NO_TIMER, StepTimer, Timer
from engine_proc.step.wake import Waker

if TYPE_CHECKING:
    from engine_proc.vision.projector import Vision

# While sequences decode, embeddings get at most this fraction (1/n) of a step's budget.
EMBED_SHARE = 4


@dataclass(slots=True)
class StepResult:
    outputs: list[SeqOutput]
    embeddings: list[Embeddings] = field(default_factory=list)
    wake: bool = True  # the frontend wants these now (see step)
    last: bool = True  # the step's own result; earlier ones carry first tokens sent before the step ends


class LLMEngine:
    def __init__(self, model_path: str, config: ServeConfig, server: int | None = None):
        if config.ranks:  # before the model loads: a model without a head is refused at once
            check_rank_head(model_path)
        self.runner = r = ModelRunner(model_path, config, server)  # server: see ModelRunner
        self.images: Images = NoImages()
        self.vision: Vision | None = None  # the projector, for tests and tools
        if config.mmproj:  # engine_proc/vision/ is imported only here: a text model's engine loads none of it
            from engine_proc.vision.image_intake import ImageIntake

            intake = ImageIntake(r, config.mmproj, config.n_threads)
            self.images, self.vision = intake, intake.vision
        # Sampling on the device: with --device-sampling on, or auto and GPU layers; never beside drafts, whose rows
        # are verified one by one.
        device = config.device_sampling == "on" or (config.device_sampling == "auto" and r.info.gpu_layers > 0)
        self.sampler = Sampler(r.ctx, r.vocab, r.n_vocab, r.eog_tokens, device and not config.spec_types)
        self.drafter = make_drafter(config, r)
        self.lora = make_adapters(config, r)
        disk = open_disk_cache(model_path, config, r)  # None without --cache-dir
        self.scheduler = Scheduler(self._scheduler_settings(config), r, disk)
        # llama-server's slot actions, their files keyed as the disk cache's (with or without --cache-dir)
        ident = identity(model_path, config, r.seq_ctx, r.token_budget, r.info.gpu_layers, r.n_streams)
        self.slots = SlotFiles(config.parallel, self.scheduler.cache, r, fingerprint(ident))
        self.embedder = Embedder(r, config.ranks)
        self.recorder = Recorder(r, self.sampler, self.scheduler, self.drafter)
        self.runs = Runs(r, self.sampler, self.recorder, self.lora)
        self.lookahead = StepAhead(r, self.sampler, self.scheduler, self.recorder)
        self.decoding: Decoding = (
            SteadyDecoding(self.runs, self.lookahead, self.scheduler, self.recorder)
            if self.scheduler.steady
            else PlainDecoding(self.runs, self.drafter, r.token_budget)
        )
        self.info: ModelInfo = replace(
            r.info,
            spec_type=",".join(config.spec_types) or "none",
            draft_max=config.draft_max,
            embedding_dim=self.embedder.dim,
            max_embedding_tokens=self.embedder.max_tokens,
            rerank=self.embedder.rank,
            mmproj=config.mmproj or "",
            image_tokens=self.images.image_tokens,
            image_grid=self.images.image_grid,
        )
        self._timer: Timer = NO_TIMER
        self.steps = 0
        cpu_bound = self.runner.info.gpu_layers == 0 and self.runner.threads.most >= (os.cpu_count() or 1)
        self.waker = Waker(config.stream_interval_ms / 1000, cpu_bound)
        self._step_wall = 0.0  # the last step's seconds
        self.generated_tokens = 0
        # Per-step figures gathered until the next stats(): a float and an int a step.
        self.step_seconds: list[float] = []
        self.batch_sizes: list[int] = []

    def _scheduler_settings(self, config: ServeConfig) -> SchedulerSettings:
        r = self.runner
        # Steady decode batches where a reused graph pays: on a GPU (CUDA graphs), and never beside drafts,
        # whose verification changes the batch's shape every step. On the CPU a parked row costs what a
        # sequence's token does, and a rebuilt graph little.
        steady = config.steady_steps == "on" or (config.steady_steps == "auto" and r.info.gpu_layers > 0)
        return SchedulerSettings(
            parallel=config.parallel,
            slots=config.kv_streams,
            token_budget=r.token_budget,
            seq_ctx=r.seq_ctx,
            prefix_cache=config.prefix_cache,
            exact=config.prefix_cache_exact,
            host_bytes=config.cache_ram << 20,
            admit_per_step=config.admit_per_step,
            # a steady batch keeps one shape, and adapter sets split a decode into a llama_decode each
            steady=steady and self.drafter is None and self.lora is None,
        )

    @property
    def timer(self) -> Timer:
        return self._timer

    @timer.setter
    def timer(self, timer: StepTimer | None) -> None:
        """Set, it sums the time of each part of every step (`cllm bench engine`); None: no timing."""
        if timer is not None:
            timer.synchronize = self.runner.synchronize
        self._timer = self.runs.timer = timer if timer is not None else NO_TIMER

    @property
    def decode_steps(self) -> int:
        return self.runs.decode_steps

    @property
    def reused_steps(self) -> int:
        return self.runs.reused_steps

    def add(self, req: Submit) -> SeqOutput | None:
        """Queue a request; the output that ends it at once if the engine refuses it."""
        if req.images:  # made ready beside the steps first, queued by a step once they are
            if why := self.images.refuse(req):
                return SeqOutput(req.id, finish="error", error=why)
            self.images.add(req)
            return None
        return self._queue(req, np.array(req.prompt, np.int32))

    def _queue(self, req: Submit, prompt: np.ndarray, images: list[ImageSpan] | None = None) -> SeqOutput | None:
        try:
            lora, mark = request_set(self.lora, req.sampling.lora)
        except LoraError as e:
            return SeqOutput(req.id, finish="error", error=str(e))
        try:
            sampler = self.sampler.new(req.sampling, req.prompt)
        except GrammarError:
            return SeqOutput(req.id, finish="error")
        seq = Sequence(
            req.id,
            prompt,
            req.sampling,
            sampler,
            per_step=req.per_step,
            images=images or [],
            scope=req.scope,
            lora=lora,
            mark=mark,
        )
        # Its prompt asked again may pick its first token from the logits its prefill gave (PrefixCache.lookup):
        # where the cache reuses any cells (not in exact mode) and its sampler can pick from a kept row.
        seq.keeps_logits = (
            self.scheduler.cache is not None
            and not self.scheduler.exact
            and not images
            and self.sampler.keeps(sampler)
            and req.sampling.logprobs is None
            and not seq.scored
        )
        self.scheduler.add(seq)
        return None

    def wake_fds(self) -> tuple[int, ...]:
        """What the idle engine waits on besides requests: the signal that images are ready."""
        return self.images.wake_fds()

    def embed(self, req: Embed) -> None:
        self.embedder.add(req)

    def abort(self, ids: list[int]) -> None:
        self._settle()
        gone = set(ids)
        self.lookahead.abort(gone)
        self.recorder.release(self.scheduler.remove(gone))
        self.embedder.abort(gone)
        self.images.abort(gone)

    def drop_all(self) -> None:
        self.slots.pending.clear()
        self.abort(
            [s.id for s in (*self.scheduler.running, *self.scheduler.waiting)]
            + [j.id for j in self.embedder.jobs]
            + list(self.images.pending())
        )

    def has_work(self) -> bool:
        """Sequences or embeddings to step, or requests whose images are ready; images still being made ready are
        not (the idle engine waits for them on wake_fds). Outputs an abort recorded go out in a step too."""
        return self.scheduler.has_work() or bool(self.embedder.jobs or self.lookahead.landed) or self.images.ready()

    def step(self) -> Iterator[StepResult]:
        """Schedule, run, record, retire: one step. Yields a result for each group of streamed prompts' first
        tokens as it is ready (last=False), then the step's own result (last=True)."""
        timer, turn = self._timer, Turn(time.perf_counter())
        timer.start()
        self._settle()
        going = self.decoding.going_on(self.images.ready() or bool(self.embedder.jobs), turn)
        if going is not None:  # a steady batch goes on unchanged: see _step_ahead
            yield from self._step_ahead(*going, turn)
            return
        with timer.part("schedule"):
            step = self._schedule(turn)
        yield from self._run(step, turn)  # the runs record their tokens
        with timer.part("retire"):
            self._retire(turn.done)
        result = self._result(step, turn)
        if not self.decoding.launch(bool(self.embedder.jobs)):
            self._ended(turn.t1 - turn.t0)
            yield result
            return
        yield result  # while the decode launched ahead runs
        timer.start()
        self._collect(turn.t0)

    def _schedule(self, turn: Turn) -> Step:
        turn.refused = self.images.admit(turn.outputs, self._queue)  # requests whose images are ready
        step = self.scheduler.schedule()
        self.recorder.free_left()
        self.decoding.plan(step)
        return step

    def _run(self, step: Step, turn: Turn) -> Iterator[StepResult]:
        """The step's llama_decode calls, their tokens recorded: the first tokens of streamed prompts are yielded
        as their run ends (see prefill_runs)."""
        self.decoding.first(step, turn)
        if self.scheduler.recalled:  # first tokens that need no decode (Recorder.recall)
            firsts: list[SeqOutput] = []
            with self._timer.part("sampling"):
                self.recorder.recall(self.scheduler.recalled, firsts, turn.done)
            self.generated_tokens += len(firsts)
            self._timer.lap("other")
            yield StepResult(firsts, last=False)
            self._timer.start()
        first, later = prefill_runs(step.prefill, self.scheduler.exact)
        for chunks in first:
            sent: list[SeqOutput] = []
            self.runs.run(chunks, sent, turn.done)
            self.generated_tokens += len(sent)
            self._timer.lap("other")
            yield StepResult(sent, last=False)
            self._timer.start()
        self.decoding.decode(step, turn)
        for chunks in later:
            self.runs.run(chunks, turn.outputs, turn.done)

    def _retire(self, done: list[Sequence]) -> None:
        if done:
            self.recorder.release(self.scheduler.remove({s.id for s in done}))

    def _result(self, step: Step, turn: Turn) -> StepResult:
        """The step's embeddings, in what its generation left of the budget; its figures, and whether the frontend
        wakes for its result."""
        with self._timer.part("other"):
            embeddings = self.embedder.step(self._embedding_budget(step)) if self.embedder.jobs else []
            turn.t1 = t1 = time.perf_counter()
            # The last parked sequences may leave in a step of their own: the engine's final figures go with it.
            urgent = bool(turn.done or turn.parked or turn.refused) or any(c.samples for c in step.prefill)
            wake = self.waker.wake(urgent or not self.has_work(), step.decode, t1 - turn.t0, t1)
            self.steps += 1
            self.generated_tokens += len(turn.outputs)
            self.batch_sizes.append(len(step.decode) + len({id(c.seq) for c in step.prefill}))
        return StepResult(turn.outputs, embeddings, wake)

    def _embedding_budget(self, step: Step) -> int:
        budget = self.runner.token_budget - len(step.decode) - sum(c.end - c.start for c in step.prefill)
        if step.decode:  # embedding is prefill work: a full budget of it beside decoding streams slows them ~15x
            budget = min(budget, self.runner.token_budget // EMBED_SHARE)
        return budget

    def _step_ahead(self, ahead: Ahead, chunks: list[Chunk], tokens: list[int], turn: Turn) -> Iterator[StepResult]:
        """A steady step whose decode batch is the one before it a position on (StepAhead.go_on).

        On the step's critical path: the batch written and launched on the
        decode thread, and, after the result is out, the wait for it and its
        sampling. Meanwhile, while llama.cpp computes, the tokens of the decode
        before are recorded (finish checks, outputs; the finished parked) and
        the step's result goes to the ring. A sequence that finished on its
        last token is still in the batch launched: it decodes a token more,
        which a parked sequence does anyway (Scheduler.park).
        """
        timer = self._timer
        timer.lap("schedule")
        with timer.part("batch"):
            self.lookahead.launch(chunks, tokens)
        with timer.part("overlapped"):
            parked = self.lookahead.land(ahead, turn.outputs)
            t1 = time.perf_counter()
            wake = self.waker.wake(bool(parked), chunks, self._step_wall, t1)
            self.steps += 1
            self.generated_tokens += len(turn.outputs)
            self.batch_sizes.append(len(chunks))
        yield StepResult(turn.outputs, [], wake)
        timer.start()
        self._collect(turn.t0)

    def _settle(self) -> None:
        """A decode launched by a step that was left before its end (the process stopping) ends before the
        context is used again."""
        if self.lookahead.inflight is not None:
            self._collect(time.perf_counter())

    def _collect(self, t0: float) -> None:
        """Wait for the decode launched ahead and sample its rows (StepAhead.collect); the step's figures."""
        self.lookahead.collect(self._timer)
        self.runs.counted()
        self._ended(time.perf_counter() - t0)
        self._timer.lap("sampling")

    def _ended(self, seconds: float) -> None:
        self._step_wall = seconds
        self.step_seconds.append(seconds)

    def load_lora(self, msg: LoraLoad) -> tuple[LoraDone, list[SeqOutput]]:
        """A run-time adapter load or unload (--allow-lora-load); the sequences an unload ended."""
        try:
            if self.lora is None:
                raise LoraError("the engine takes no LoRA adapters")
            if not msg.unload:
                self.lora.load(msg.adapter, msg.path)
                return LoraDone(msg.id), []
        except LoraError as e:
            return LoraDone(msg.id, str(e)), []
        self._settle()
        sets = self.lora.using(msg.adapter)
        gone = [s.id for s in (*self.scheduler.running, *self.scheduler.waiting) if s.lora in sets]
        self.abort(gone)
        self.lora.unload(msg.adapter)
        return LoraDone(msg.id), [
            SeqOutput(i, finish="error", error=f"LoRA adapter {msg.adapter} was unloaded") for i in gone
        ]

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
            self.drafter.report(stats)
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
        if self.lora is not None:
            self.lora.close()
        self.images.close()
        self.runner.close()
