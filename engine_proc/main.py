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
    Embed,
    EngineReady,
    Hello,
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
    requests, outputs = Ring(launch.rings.requests), Ring(launch.rings.outputs)
    # An engine that died before us may have left its wait flags up.
    requests.end_wait()
    outputs.end_space_wait()
    decode = msgspec.msgpack.Decoder(ToEngine).decode
    encode = msgspec.msgpack.Encoder().encode

    # SIGTERM ends the loop; the wake-up fd breaks a select() at once.
    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_w, False)
    signal.set_wakeup_fd(stop_w)
    stopping = False

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    watch = (launch.lifeline, stop_r)

    def send(msg, wake: bool = True) -> None:
        # Blocks while the frontend is behind; a frontend that died is replaced
        # by one that drains, and meanwhile the lifeline and SIGTERM still count.
        if outputs.put(encode(msg), watch, wake):
            raise _Stop

    try:
        engine = LLMEngine(launch.model_path, launch.config, server=os.getppid())  # the supervisor, or Ray's replica
    except ModelLoadError as e:
        log.error("%s", e)
        return EXIT_LOAD_FAILED
    _log_start(engine.info, f"{launch.model_id}#{launch.replica}")

    session = None  # records before the first Hello were meant for a dead engine
    stats_due = 0.0
    reported = False  # the frontend has the figures of every step so far
    try:
        while not stopping:
            records = requests.drain()
            reported = reported and not records
            if not records and not engine.has_work():
                # idle: cache entries went to disk or files into streams (--cache-dir); figures go out
                if engine.persist():
                    reported = False
                if session is not None and not reported:
                    send(engine.stats())  # going idle: the frontend sees the final figures
                    reported = True
                if launch.lifeline in requests.wait(watch + engine.wake_fds(), engine.persist_wait()):
                    break  # the supervisor is gone
                continue
            refused: list[SeqOutput] = []
            for record in records:
                msg = decode(record)
                if type(msg) is Hello:
                    engine.drop_all()  # they belonged to a frontend that is gone
                    refused.clear()
                    session = msg.session
                    send(EngineReady(engine.info, session, launch.generation))
                elif session is None:
                    continue
                elif type(msg) is Submit:
                    out = engine.add(msg)
                    if out is not None:
                        refused.append(out)
                elif type(msg) is Embed:
                    engine.embed(msg)
                elif type(msg) is SlotAction:
                    engine.slots.pending.append(msg)
                else:
                    engine.abort(msg.ids)
            if refused:
                send(StepOutputs(refused))
            if engine.has_work():
                for result in engine.step():  # first tokens as they come, then the step's result
                    if result.last:
                        reported = not engine.has_work()
                        # the figures go before the last outputs: whoever sees a response end sees its figures
                        if reported:
                            send(engine.stats(), wake=False)
                    send(StepOutputs(result.outputs), result.wake)
                    for vectors in result.embeddings:
                        send(vectors)
                if not reported and time.monotonic() >= stats_due:
                    if select.select([launch.lifeline], [], [], 0)[0]:
                        break  # the supervisor is gone: no one will read what we make
                    send(engine.stats())
                    stats_due = time.monotonic() + STATS_INTERVAL
            if engine.slots.pending:  # slot actions, between steps: those whose streams no sequence runs in
                for done in engine.slot_actions():
                    send(done)
                    reported = False  # the cache's figures changed
    except _Stop:
        pass
    finally:
        engine.close()
    return 0


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
        "KV cache: %d cells (%d sequences of %d) and %d cache slots, %.1f MiB reserved; %d threads, %d-token steps;"
        " K %s, V %s; %d GPU layers",
        info.ctx_size,
        info.parallel,
        info.seq_ctx,
        info.cache_slots,
        info.kv_bytes / MIB,
        info.threads,
        info.batch_size,
        info.cache_type_k,
        info.cache_type_v,
        info.gpu_layers,
    )


if __name__ == "__main__":
    sys.exit(main())
