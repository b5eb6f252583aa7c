"""The engine process: drain requests, step while there is work, block when idle."""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import time

import msgspec

from cllm.core.launch import EXIT_LOAD_FAILED, from_argv
from cllm.core.log import setup_logging
from cllm.core.protocol import (
    Abort,
    Embed,
    EngineReady,
    Hello,
    LoraLoad,
    ModelInfo,
    SeqOutput,
    SlotAction,
    StepOutputs,
    Submit,
    ToEngine,
)
from cllm.core.ring import Ring
from engine_proc.engine import LLMEngine
from engine_proc.run.model_runner import ModelLoadError

STATS_INTERVAL = 1.0  # seconds between EngineStats (and lifeline checks) while busy
MIB = 1 << 20

log = logging.getLogger("cllm.engine")


class _Stop(Exception):
    """SIGTERM, or the supervisor is gone."""


def main() -> int:
    launch = from_argv()
    setup_logging(launch.config.log_level, launch.config.log_format)
    assert launch.rings is not None  # an engine's launch names its rings
    requests, outputs = Ring(launch.rings.requests), Ring(launch.rings.outputs)
    # An engine that died before us may have left its wait flags up.
    requests.end_wait()
    outputs.end_space_wait()
    # SIGTERM ends the loop; the wake-up fd breaks a select() at once.
    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_w, False)
    signal.set_wakeup_fd(stop_w)
    loop = _Loop(requests, outputs, (launch.lifeline, stop_r), launch.generation)
    signal.signal(signal.SIGTERM, loop.on_term)
    signal.signal(signal.SIGINT, loop.on_term)
    try:
        engine = LLMEngine(launch.model_path, launch.config, server=os.getppid())  # the supervisor, or Ray's replica
    except ModelLoadError as e:
        log.error("%s", e)
        return EXIT_LOAD_FAILED
    _log_start(engine.info, f"{launch.model_id}#{launch.replica}")
    if engine.runner.warmed:
        log.info("warm-up: a %d-token prompt decoded and dropped in %.2f s", *engine.runner.warmed)
    try:
        loop.run(engine)
    except _Stop:
        pass
    finally:
        engine.close()
    return 0


class _Loop:
    """Drain the requests, step while there is work, block when idle; the outputs to the ring."""

    def __init__(self, requests: Ring, outputs: Ring, watch: tuple[int, int], generation: int):
        self.requests, self.outputs = requests, outputs
        self.watch = watch  # the lifeline (the supervisor's end of a pipe) and SIGTERM's wake-up fd
        self.lifeline = watch[0]
        self.generation = generation
        self.decode = msgspec.msgpack.Decoder(ToEngine).decode
        self.encode = msgspec.msgpack.Encoder().encode
        self.stopping = False
        self.session: int | None = None  # records before the first Hello were meant for a dead engine
        self.reported = False  # the frontend has the figures of every step so far

    def on_term(self, signum, frame) -> None:
        self.stopping = True

    def send(self, msg, wake: bool = True) -> None:
        # Blocks while the frontend is behind; a frontend that died is replaced
        # by one that drains, and meanwhile the lifeline and SIGTERM still count.
        if self.outputs.put(self.encode(msg), self.watch, wake):
            raise _Stop

    def run(self, engine: LLMEngine) -> None:
        stats_due = 0.0
        while not self.stopping:
            records = self.requests.drain()
            self.reported = self.reported and not records
            if not records and not engine.has_work():
                if self._idle(engine):
                    break  # the supervisor is gone
                continue
            refused = self._take(engine, records)
            if refused:
                self.send(StepOutputs(refused))
            if engine.has_work():
                self._step(engine)
                if not self.reported and time.monotonic() >= stats_due:
                    if select.select([self.lifeline], [], [], 0)[0]:
                        break  # the supervisor is gone: no one will read what we make
                    self.send(engine.stats())
                    stats_due = time.monotonic() + STATS_INTERVAL
            if engine.slots.pending:  # slot actions, between steps: those whose streams no sequence runs in
                for done in engine.slot_actions():
                    self.send(done)
                    self.reported = False  # the cache's figures changed

    def _idle(self, engine: LLMEngine) -> bool:
        """Cache entries go to disk or files into streams (--cache-dir), figures go out, and the wait for
        requests; whether the supervisor is gone."""
        if engine.persist():
            self.reported = False
        if self.session is not None and not self.reported:
            self.send(engine.stats())  # going idle: the frontend sees the final figures
            self.reported = True
        return self.lifeline in self.requests.wait(self.watch + engine.wake_fds(), engine.persist_wait())

    def _take(self, engine: LLMEngine, records: list) -> list[SeqOutput]:
        """The records given to the engine; the outputs of the requests it refused at once."""
        refused: list[SeqOutput] = []
        for record in records:
            msg = self.decode(record)
            if type(msg) is Hello:
                engine.drop_all()  # they belonged to a frontend that is gone
                refused.clear()
                self.session = msg.session
                self.send(EngineReady(engine.info, msg.session, self.generation))
            elif self.session is None:
                continue
            elif type(msg) is Submit:
                out = engine.add(msg)
                if out is not None:
                    refused.append(out)
            elif type(msg) is Embed:
                engine.embed(msg)
            elif type(msg) is SlotAction:
                engine.slots.pending.append(msg)
            elif type(msg) is Abort:
                engine.abort(msg.ids)
            elif type(msg) is LoraLoad:
                done, ended = engine.load_lora(msg)
                refused += ended
                self.send(done)
        return refused

    def _step(self, engine: LLMEngine) -> None:
        for result in engine.step():  # first tokens as they come, then the step's result
            if result.last:
                self.reported = not engine.has_work()
                # the figures go before the last outputs: whoever sees a response end sees its figures
                if self.reported:
                    self.send(engine.stats(), wake=False)
            self.send(StepOutputs(result.outputs), result.wake)
            for vectors in result.embeddings:
                self.send(vectors)


def _log_start(info: ModelInfo, name: str) -> None:
    log.info(
        "engine %s, model %s: %s %s, %.0fM parameters, %.1f MiB",
        name,
        info.model_path,
        info.model_family,
        info.quantization,
        info.n_params / 1e6,
        info.model_bytes / MIB,
    )
    log.info(
        "KV cache: %d cells (%d sequences of %d) and %d cache slots, %.1f MiB reserved; compute buffers %.1f MiB;"
        " %d threads, %d-token steps; K %s, V %s; %d GPU layers",
        info.ctx_size,
        info.parallel,
        info.seq_ctx,
        info.cache_slots,
        info.kv_bytes / MIB,
        info.compute_bytes / MIB,
        info.threads,
        info.batch_size,
        info.cache_type_k,
        info.cache_type_v,
        info.gpu_layers,
    )


if __name__ == "__main__":
    sys.exit(main())
