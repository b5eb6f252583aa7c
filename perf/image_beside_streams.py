"""How long an image request delays 7 streaming text requests' tokens, against one prefill chunk of text.

The engine runs in-process (engine_proc.engine.LLMEngine, as engine_proc/main.py drives it) with a made projector
(perf/synth_mmproj.py, --tower). 7 text requests decode, one token a step each; once they do, one more request
arrives: an image request (its image encoded in the engine's image thread while the 7 decode, its rows decoded in
the step's budget), or, alternating with it, a text prompt of one prefill chunk (the step's budget less the 7
decode tokens). Reported per event: the 7 streams' inter-token gaps from its arrival until its first token (the
longest, and the median), beside the gaps of the steps before it, and the event's own time to its first token.
Rounds alternate (text, image, text, ...). Usage:
    PYTHONPATH=$PWD .venv/bin/python -m perf.image_beside_streams [--tower vit-b16] [--rounds 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import tempfile
import time

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from cllm.core.protocol import ImageInput, SamplingParams, Submit
from engine_proc.engine import LLMEngine
from perf import image_files, synth_mmproj

STREAMS = 7
STEADY_STEPS = 12  # decode steps of the 7 before the event: the gaps without it
TAIL_STEPS = 4  # after the event's first token
STREAM = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)
ONE = SamplingParams(max_tokens=1, temperature=0.0)


def event_round(engine: LLMEngine, kind: str, n: int, budget: int) -> dict:
    """One round: 7 streams, then the event (``kind``: text or image); the gaps before and during it."""
    base = 1000 * n
    for i in range(STREAMS):
        engine.add(Submit(base + i, [1, 2, 3, 100 + i + 10 * n], STREAM))
    stamps: dict[int, list[float]] = {base + i: [] for i in range(STREAMS)}
    event_id, arrived, first = base + 99, 0.0, 0.0
    steps_after = 0
    while True:
        if not engine.has_work():  # only the event's image being encoded: wait as engine_proc/main.py does
            select.select(engine.wake_fds(), [], [], 1.0)
            continue
        for result in engine.step():
            now = time.perf_counter()
            for out in result.outputs:
                if out.id in stamps:
                    stamps[out.id].append(now)
                elif out.id == event_id and not first:
                    first = now
        if not arrived and min(len(s) for s in stamps.values()) >= STEADY_STEPS:
            arrived = time.perf_counter()
            if kind == "image":  # a new picture each round: none is in the prefix cache
                image = image_files.png(image_files.picture(640, 480, seed=n))
                engine.add(Submit(event_id, [1, 2, 3, 7], ONE, images=[ImageInput(3, image)]))
            else:  # one prefill chunk: the step's budget less the 7 decode tokens
                engine.add(Submit(event_id, [(j * 37 + n) % 20_000 + 10 for j in range(budget - STREAMS)], ONE))
        if first:
            steps_after += 1
            if steps_after >= TAIL_STEPS:
                break
    engine.abort(list(stamps))
    while engine.has_work():
        list(engine.step())
    before, during = [], []
    for s in stamps.values():
        for a, b in zip(s, s[1:]):
            if b <= arrived:
                before.append(b - a)
            elif a < first:  # a gap that overlaps the event, up to its first token
                during.append(b - a)
    return {
        "kind": kind,
        "ttft": first - arrived,
        "before_median": statistics.median(before),
        "during_median": statistics.median(during),
        "during_max": max(during),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tower", choices=synth_mmproj.TOWERS, default="vit-b16")
    ap.add_argument("--rounds", type=int, default=4, help="pairs of events (text, image)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=512)
    args = ap.parse_args()
    model_path = resolve_model(None)
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = synth_mmproj.write(
            os.path.join(tmp, "mmproj.gguf"),
            synth_mmproj.text_embedding_width(model_path),
            synth_mmproj.TOWERS[args.tower],
        )
        config = ServeConfig(
            parallel=8, ctx_size=8 * 1024, threads=args.threads, batch_size=args.batch_size, mmproj=mmproj
        )
        engine = LLMEngine(model_path, config)
    try:
        print(f"image positions {engine.info.image_tokens}, step budget {engine.runner.token_budget}")
        event_round(engine, "image", 0, engine.runner.token_budget)  # warm-up
        print("| round | event | event's first token (ms) | gaps before: median (ms) | during: median | during: max |")
        print("|---|---|---|---|---|---|")
        for n in range(1, args.rounds + 1):
            for kind in ("text", "image"):
                r = event_round(engine, kind, 2 * n + (kind == "image"), engine.runner.token_budget)
                print(
                    f"| {n} | {kind} | {1000 * r['ttft']:.0f} | {1000 * r['before_median']:.1f} | "
                    f"{1000 * r['during_median']:.1f} | {1000 * r['during_max']:.1f} |",
                    flush=True,
                )
    finally:
        engine.close()


if __name__ == "__main__":
    main()
