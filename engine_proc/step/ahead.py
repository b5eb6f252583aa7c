"""A steady decode run one step ahead of the Python that records its tokens (docs/internals.md: One step ahead).

With steady steps a decode's batch is known before the tokens of the decode
before it are recorded (Scheduler.go_on: the same sequences, each a position
on), so it is launched on the decode thread (engine_proc/run/decode_thread.py),
and while llama.cpp computes the engine records the tokens before and writes
its result to the ring. What this holds between steps: the decode in flight,
and the one collected (waited for and sampled) whose tokens are not recorded
yet. LLMEngine.step runs it (engine_proc/step/decoding.py: SteadyDecoding, and LLMEngine._step_ahead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cllm.core.protocol import SeqOutput
from engine_proc.run.model_runner import ModelRunner
from engine_proc.sampling.sampler import Sampler
from engine_proc.scheduler import Scheduler
from engine_proc.sequence import Chunk, Sequence
from engine_proc.step.recorder import Recorder
from engine_proc.step.timer import Timer


@dataclass(slots=True)
class Ahead:
    """A steady decode that ran ahead of its step: its batch and sampled tokens, not recorded yet."""

    chunks: list[Chunk]
    tokens: list[int]


@dataclass(slots=True)
class StepAhead:
    runner: ModelRunner
    sampler: Sampler
    scheduler: Scheduler
    recorder: Recorder
    ahead: Ahead | None = field(default=None, init=False)  # collected, its tokens not recorded
    inflight: list[Chunk] | None = field(default=None, init=False)  # the batch of the decode on the decode thread
    landed: list[SeqOutput] = field(default_factory=list, init=False)  # a decode ahead's outputs, for abort()

    def next_decode(self, embedding: bool) -> list[Chunk] | None:
        """A steady step's next decode batch, when it is known before the step's result goes out: no prompt
        work or embedding waits, and no sequence asks for logprobs (read from the logits the decode ahead
        overwrites)."""
        if embedding:
            return None
        running = self.scheduler.running
        if not running or any(s.prefilling or s.params.logprobs is not None for s in running):
            return None
        return self.scheduler.decode_batch()

    def go_on(self, ahead: Ahead) -> tuple[list[Chunk], list[int]] | None:
        """The batch after ``ahead``'s, its sequences a position on, and the tokens it decodes (a parked
        sequence's last one again); None when the batch changes (Scheduler.go_on)."""
        if min(ahead.tokens) < 0:  # a grammar's dead end ends its sequence
            return None
        chunks = self.scheduler.go_on(ahead.chunks)
        if chunks is None:
            return None
        return chunks, [c.seq.output[-1] if c.seq.parked else t for c, t in zip(chunks, ahead.tokens)]

    def launch(self, chunks: list[Chunk], tokens: list[int] | None = None) -> None:
        if self.sampler.device and tokens is None:  # after a wave, which may have moved sequences to other slots
            for c in chunks:
                self.sampler.attach(c.seq.sampler, c.seq.slot)
        self.runner.fill(chunks, True, tokens)
        self.runner.launch()
        self.inflight = chunks

    def collect(self, timer: Timer) -> None:
        """Wait for the decode launched and sample its rows: the next step records the tokens."""
        chunks, self.inflight = self.inflight, None
        assert chunks is not None
        with timer.part("llama_decode"):
            self.runner.wait()
        tokens = self.sampler.sample_rows([c.seq.sampler for c in chunks], list(range(-len(chunks), 0)))
        self.ahead = Ahead(chunks, tokens)

    def land(self, ahead: Ahead, outputs: list[SeqOutput]) -> int:
        """Record the tokens of the decode that ran ahead; its finished sequences are parked. How many finished."""
        done: list[Sequence] = []
        self.recorder.record(ahead.chunks, list(range(-len(ahead.chunks), 0)), ahead.tokens, outputs, done)
        finished = len(done)
        self.recorder.park(done)  # chains on the device stay attached: nothing changes the context while it decodes
        return finished

    def abort(self, gone: set[int]) -> None:
        """Before sequences leave: if one is in the batch ahead, the batch changes, so its tokens are recorded first
        (the next step sends them, the aborted ones' dropped)."""
        ahead = self.ahead
        if ahead is not None and any(c.seq.id in gone for c in ahead.chunks):
            self.ahead = None
            self.land(ahead, self.landed)
            self.landed = [o for o in self.landed if o.id not in gone]
