"""The engine process: drain requests, step while there is work, block when idle."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import msgspec

from cllm.launch import from_argv
from cllm.log import setup_logging
from cllm.protocol import EngineReady, ModelInfo, StepOutputs, Submit, ToEngine
from cllm.ring import Ring
from engine_proc.engine import LLMEngine
from engine_proc.model_runner import ModelLoadError

STATS_INTERVAL = 1.0  # seconds between EngineStats while busy
MIB = 1 << 20

log = logging.getLogger("cllm.engine")


def main() -> int:
    launch = from_argv()
    setup_logging(launch.config.log_level, launch.config.log_format)
    requests, outputs = Ring(launch.requests), Ring(launch.outputs)
    decode = msgspec.msgpack.Decoder(ToEngine).decode
    encode = msgspec.msgpack.Encoder().encode

    # SIGTERM ends the loop; the wake-up fd breaks an idle select() at once.
    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_w, False)
    signal.set_wakeup_fd(stop_w)
    stopping = False

    def on_term(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    try:
        engine = LLMEngine(launch.model_path, launch.config)
    except ModelLoadError as e:
        log.error("%s", e)
        return 1
    _log_start(engine.runner.info)
    outputs.put(encode(EngineReady(engine.runner.info)))

    stats_due = 0.0
    try:
        while not stopping:
            records = requests.drain()
            if not records and not engine.has_work():
                outputs.put(encode(engine.stats()))  # going idle: the frontend sees the final figures
                if launch.lifeline in requests.wait((launch.lifeline, stop_r)):
                    break  # the supervisor is gone
                continue
            refused = []
            for record in records:
                msg = decode(record)
                if type(msg) is Submit:
                    out = engine.add(msg)
                    if out is not None:
                        refused.append(out)
                else:
                    engine.abort(msg.ids)
            if refused:
                outputs.put(encode(StepOutputs(refused)))
            if engine.has_work():
                outputs.put(encode(StepOutputs(engine.step())))
                if time.monotonic() >= stats_due:
                    outputs.put(encode(engine.stats()))
                    stats_due = time.monotonic() + STATS_INTERVAL
    finally:
        engine.close()
    return 0


def _log_start(info: ModelInfo) -> None:
    log.info(
        "model %s: %s %s, %.0fM parameters, %.1f MiB",
        info.model_path, info.model_family, info.quantization, info.n_params / 1e6, info.model_bytes / MIB,
    )
    log.info(
        "KV cache: %d cells (%d sequences of %d), %.1f MiB reserved; %d threads, %d-token steps",
        info.ctx_size, info.parallel, info.seq_ctx, info.kv_bytes / MIB, info.threads, info.batch_size,
    )


if __name__ == "__main__":
    sys.exit(main())
