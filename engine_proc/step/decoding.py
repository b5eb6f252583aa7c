"""How a step runs its decode batch (LLMEngine.step): plainly, between the prompts' first tokens and their other
chunks, with speculative drafts where they pay (PlainDecoding); or in steady steps, first, in the shape of the
step before, and launched one step ahead of the Python that records its tokens (SteadyDecoding, with
engine_proc/step/ahead.py). A step calls each hook where it applies; the other kind does nothing there."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from cllm.core.protocol import SeqOutput
from engine_proc.scheduler import Scheduler, Step
from engine_proc.sequence import Chunk, Sequence
from engine_proc.step.ahead import Ahead, StepAhead
from engine_proc.step.drafter import Drafter
from engine_proc.step.recorder import Recorder
from engine_proc.step.runs import Runs

# A steady step whose batch goes on unchanged: the decode that ran ahead, and the next batch and its tokens.
Going = tuple[Ahead, list[Chunk], list[int]]


@dataclass(slots=True)
class Turn:
    """One step's books while it runs."""

    t0: float  # when it began
    outputs: list[SeqOutput] = field(default_factory=list)
    done: list[Sequence] = field(default_factory=list)  # finished, to retire
    parked: int = 0  # finished in a steady decode, parked in its batch (Scheduler.park)
    refused: bool = False  # requests ended at once, their images not made
    t1: float = 0.0  # when its own work ended


class Decoding(Protocol):
    def going_on(self, busy: bool, turn: Turn) -> Going | None:
        """Before the schedule: the batch run ahead going on unchanged (not while ``busy``: other work waits);
        or else its tokens recorded into ``turn``."""
        ...

    def plan(self, step: Step) -> None:
        """After the schedule: the decode batch lengthened with drafts."""
        ...

    def first(self, step: Step, turn: Turn) -> None:
        """Before the prompts' runs: the steady decode, then a wave's admissions into ``step``."""
        ...

    def decode(self, step: Step, turn: Turn) -> None:
        """Between the prompts' first tokens and their other chunks: the plain decode."""
        ...

    def launch(self, busy: bool) -> bool:
        """After the step's own work: the next decode launched ahead, when it is known already."""
        ...


class PlainDecoding:
    def __init__(self, runs: Runs, drafter: Drafter | None, token_budget: int):
        self.runs = runs
        self.drafter = drafter
        self.token_budget = token_budget
        self._drafting: Drafter | None = None  # the drafter, in a step whose decode it lengthened

    def going_on(self, busy: bool, turn: Turn) -> Going | None:
        return None

    def plan(self, step: Step) -> None:
        # Drafts only in steps without prompt work: those are compute-bound already.
        self._drafting = self.drafter if step.decode and not step.prefill else None
        if self._drafting is not None:
            self._drafting.draft(step.decode, self.token_budget - len(step.decode))

    def first(self, step: Step, turn: Turn) -> None:
        pass

    def decode(self, step: Step, turn: Turn) -> None:
        if not step.decode:
            return
        t = time.perf_counter()
        self.runs.run(step.decode, turn.outputs, turn.done, plain=self._drafting is None)
        self.runs.counted()
        if self._drafting is not None:
            self._drafting.end_step(len(step.decode), time.perf_counter() - t)

    def launch(self, busy: bool) -> bool:
        return False


class SteadyDecoding:
    """Steady steps (engine_proc/scheduler.py): the decode keeps its shape between waves, and runs ahead."""

    def __init__(self, runs: Runs, lookahead: StepAhead, scheduler: Scheduler, recorder: Recorder):
        self.runs = runs
        self.lookahead = lookahead
        self.scheduler = scheduler
        self.recorder = recorder
        self._ran_ahead = False  # this step's decode ran ahead of it

    def going_on(self, busy: bool, turn: Turn) -> Going | None:
        look = self.lookahead
        ahead, look.ahead = look.ahead, None
        self._ran_ahead = ahead is not None
        if ahead is not None and not busy and (following := look.go_on(ahead)) is not None:
            return ahead, *following
        # The decode that ran ahead was this step's: its tokens are recorded first, as a steady step's decode's are.
        turn.outputs, look.landed = look.landed, []
        turn.parked = sum(o.finish is not None for o in turn.outputs)  # sequences that finished in a steady decode
        if ahead is not None:
            turn.parked += look.land(ahead, turn.outputs)
        return None

    def plan(self, step: Step) -> None:
        pass

    def first(self, step: Step, turn: Turn) -> None:
        """The decode first, in the shape of the step before; then the wave's admissions (Scheduler.wave)."""
        if step.decode and not self._ran_ahead:
            self.runs.run(step.decode, turn.outputs, turn.done, plain=True)
            self.runs.counted()
            turn.parked += len(turn.done)
            self.recorder.park(turn.done)
        with self.runs.timer.part("schedule"):
            self.scheduler.wave(step)
            self.recorder.free_left()

    def decode(self, step: Step, turn: Turn) -> None:
        pass

    def launch(self, busy: bool) -> bool:
        chunks = self.lookahead.next_decode(busy)
        if chunks is None:
            return False
        with self.runs.timer.part("batch"):
            self.lookahead.launch(chunks)
        return True
