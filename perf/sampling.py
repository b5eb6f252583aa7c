"""What sampling costs per engine step, by sampling setting, with 32 sequences decoding.

Runs LLMEngine in-process (no HTTP), admits 32 requests with the same
settings, lets them finish prefill, then times `Sampler.sample` (and
`Sampler.logprobs` where asked) over the steps that follow, alongside the
whole step. Sampling runs on the engine's thread, so it is timed in that
thread's CPU time, which other processes on a busy machine do not inflate;
the whole step (llama.cpp's decode threads included) is wall time. Usage:
    .venv/bin/python -m perf.sampling [--model PATH] [--sequences 32] [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import msgspec
from llama_cpp.llama_grammar import JSON_GBNF

from cllm.bench.prompts import make_prompts
from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from cllm.core.protocol import SamplingParams, Submit
from engine_proc.engine import LLMEngine
from frontend_proc.core.tokenizer import Tokenizer

SETTINGS = {
    "greedy": SamplingParams(temperature=0),
    "cllm default (T 0.7, top-k 40, top-p 0.9)": SamplingParams(),
    "/v1 default (T 1, top-k 40)": SamplingParams(temperature=1.0, top_p=1.0),
    "whole vocabulary (T 1, no top-k/top-p)": SamplingParams(temperature=1.0, top_k=0, top_p=1.0),
    "+ presence/frequency/repetition penalties": SamplingParams(
        presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1
    ),
    "  the same with no top-k": SamplingParams(
        top_k=0, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1
    ),
    "+ logit_bias (3 tokens)": SamplingParams(logit_bias={100: 5.0, 200: -5.0, 300: 1.0}),
    "+ logprobs, top 5": SamplingParams(logprobs=5),
    "+ JSON grammar": SamplingParams(grammar=JSON_GBNF),
}


class Timed:
    """Wraps a method and adds up the CPU time the calling thread spends in it."""

    def __init__(self, fn):
        self.fn, self.total = fn, 0.0

    def __call__(self, *args):
        t = time.thread_time()
        try:
            return self.fn(*args)
        finally:
            self.total += time.thread_time() - t


def measure(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, steps: int
) -> tuple[float, float, int]:
    """Median per-step sampling and whole-step seconds over `steps` decode steps; the fewest sequences running."""
    for i, prompt in enumerate(prompts):
        # ignore_eos keeps all running; a grammar needs its end token, so those may finish early.
        engine.add(
            Submit(
                i, prompt, msgspec.structs.replace(params, max_tokens=10_000, ignore_eos=params.grammar is None, seed=i)
            )
        )
    while any(s.prefilling for s in engine.scheduler.running) or engine.scheduler.waiting:
        list(engine.step())
    sample, logprobs = Timed(engine.sampler.sample), Timed(engine.sampler.logprobs)
    engine.sampler.sample, engine.sampler.logprobs = sample, logprobs  # type: ignore[method-assign]
    sampling, whole, fewest = [], [], len(prompts)
    try:
        for _ in range(steps):
            fewest = min(fewest, len(engine.scheduler.running))
            before = sample.total + logprobs.total
            t = time.perf_counter()
            list(engine.step())
            whole.append(time.perf_counter() - t)
            sampling.append(sample.total + logprobs.total - before)
    finally:
        del engine.sampler.sample, engine.sampler.logprobs
        engine.abort(list(range(len(prompts))))
    return statistics.median(sampling), statistics.median(whole), fewest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--sequences", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    model = resolve_model(args.model)
    tok = Tokenizer(model)
    prompts = [tok.encode(p) for p in make_prompts(args.sequences, seed=1)]
    engine = LLMEngine(model, ServeConfig(parallel=args.sequences, ctx_size=args.sequences * 512))
    try:
        print(f"{args.sequences} sequences decoding; median over {args.steps} steps")
        print(f"{'setting':45} {'sampling/step':>14} {'per seq':>9} {'whole step':>11} {'running':>8}")
        for name, params in SETTINGS.items():
            sampling, whole, fewest = measure(engine, prompts, params, args.steps)
            print(
                f"{name:45} {sampling * 1e3:11.2f} ms {sampling / args.sequences * 1e6:6.0f} us {whole * 1e3:8.1f} ms"
                f" {fewest:>8}"
            )
    finally:
        engine.close()


if __name__ == "__main__":
    main()
