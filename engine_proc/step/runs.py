"""One run of a step: a llama_decode of a group of chunks, then a token sampled for each chunk that ends its
sequence's known tokens, and the tokens recorded (engine_proc/step/recorder.py). A step makes one run of its
decode batch and one of each group of prompt chunks (engine_proc/run/prefill_runs.py)."""

from __future__ import annotations

from cllm.core.protocol import SeqOutput
from engine_proc.run.lora import Adapters
from engine_proc.run.model_runner import ModelRunner
from engine_proc.sampling.sampler import Sampler
from engine_proc.sequence import Chunk, Sequence
from engine_proc.step.recorder import Recorder
from engine_proc.step.timer import NO_TIMER, Timer


class Runs:
    def __init__(self, runner: ModelRunner, sampler: Sampler, recorder: Recorder, lora: Adapters | None = None):
        self.runner = runner
        self.lora = lora  # None: no adapters, and no look for adapter sets
        self.sampler = sampler
        self.recorder = recorder
        self.timer: Timer = NO_TIMER
        self.decode_steps = 0  # llama_decode calls of decoding sequences' tokens
        self.reused_steps = 0  # of those, the ones whose compute graph llama.cpp reused from the call before

    def run(self, chunks: list[Chunk], outputs: list[SeqOutput], done: list[Sequence], plain: bool = False) -> None:
        """One llama_decode, then a token for each chunk that ends its sequence's known tokens; with LoRA
        adapters, one of each for every adapter set among the chunks (engine_proc/run/lora.py).

        ``plain``: the chunks are the decode batch without drafts (see Batch.fill).
        """
        if self.lora is not None:
            for n, group in self.lora.groups(chunks):
                self.lora.apply(n)
                self._run(group, outputs, done, plain)
        else:
            self._run(chunks, outputs, done, plain)

    def _run(self, chunks: list[Chunk], outputs: list[SeqOutput], done: list[Sequence], plain: bool) -> None:
        timer = self.timer
        if self.sampler.device:
            for c in chunks:
                if c.samples:
                    self.sampler.attach(c.seq.sampler, c.seq.slot)
        c, image = chunks[0], chunks[0].image
        if image is not None:  # alone in its call (engine_proc/run/prefill_runs.py)
            rows: list[int | None] = [-1 if c.samples else None]
            k0, k1 = c.start - image.start, c.end - image.start
            pos = image.positions(k0, k1, c.seq.position(image.start))
            with timer.part("llama_decode"):
                self.runner.decode_rows(image.rows[k0:k1], pos, c.seq.slot, c.samples, image.non_causal)
                timer.synchronize()
        else:
            with timer.part("batch"):
                rows = self.runner.fill(chunks, plain)
            with timer.part("llama_decode"):
                self.runner.decode()
                timer.synchronize()
        with timer.part("sampling"):
            if plain:
                tokens = self.sampler.sample_rows([c.seq.sampler for c in chunks], rows)
            else:  # for the chunks Recorder.record takes a sampled token for
                picks = [
                    (c.seq.sampler, row)
                    for c, row in zip(chunks, rows)
                    if c.draft is None and c.samples and not (c.scores and c.seq.params.max_tokens == 0)
                ]
                picked = [row for _, row in picks]
                tokens = self.sampler.sample_rows([s for s, _ in picks], picked) if picks else []
        with timer.part("retire"):
            self.recorder.record(chunks, rows, tokens, outputs, done)

    def counted(self) -> None:
        """A decode of the decoding sequences ran: count it, and whether llama.cpp reused its graph."""
        self.decode_steps += 1
        self.reused_steps += self.runner.reused
