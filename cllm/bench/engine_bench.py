"""`cllm bench engine`: the engine's step loop in-process, no frontend and no HTTP.

N synthetic requests of exactly P prompt tokens and G generated tokens each
(greedy, ignore_eos; with --prompts copy, input-grounded tasks of their own
length that speculative decoding can draft from) go through LLMEngine at most C at a time: a finished
request is replaced by the next one right after its step, as closed-loop
clients would. With --arrivals staggered, as real traffic does, the first C
requests arrive spread over one mean generation length and each request
generates its own length, uniform in [G/2, 3G/2] (seeded: the same each
run), so that sequences join and leave the decode batch every few steps
rather than all at once. Each loop iteration does what the engine process does: admit
the new requests (msgpack-decode the Submit, build its sampler), one
engine.step(), publish the StepOutputs (msgpack-encode, ring write, waking a
reader that sleeps as the frontend does).

Where a step's time goes comes from the engine's own timing hooks (a
StepTimer set on it for the timed run: the step marks where each part
ends, and with no timer set its marks do nothing): wall clock and the engine
thread's CPU time of schedule, batch fill, llama_decode, sampling, retire
and the rest of the step. It also counts the decode steps whose compute
graph llama.cpp reused from the step before (llama_perf_context's
n_reused), which a GPU's CUDA graphs need too. The host's work per step on
the critical path is all of it but llama_decode and what the engine does
while a decode it launched ahead runs (overlapped: steady steps, see
LLMEngine._step_ahead), reported apart; there llama_decode's time is only
the wait for it that overlapped work did not cover, and the publishing of
the step's outputs runs during the decode too. The thread's CPU time is
the steadier figure on a busy machine. A GPU's llama_decode returns before the device is done: with the
timer set, the engine waits for it there, so its time is llama_decode's
and not that of the first read of the outputs (sampling). With --profile the timer stays off, so the split is coarser:
admit, step, publish. cProfile does not see calls into C through ctypes:
llama_decode's time shows as the own time of ModelRunner.decode.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import sys
import time
from collections import defaultdict, deque

import msgspec

from cllm.bench.engine_report import HOST_PARTS, report, sweep_table
from cllm.bench.prompts import copy_prompts, make_prompts
from cllm.core.config import DeviceSampling, ServeConfig, SpecType, SteadySteps
from cllm.core.launch import OUTPUT_RING_BYTES
from cllm.core.model_file import ModelFileError, resolve_model
from cllm.core.protocol import SamplingParams, StepOutputs, Submit, ToEngine
from cllm.core.ring import Ring
from engine_proc.step.timer import StepTimer

DEFAULTS = ServeConfig()


def gen_lengths(n: int, gen_tokens: int, staggered: bool) -> list[int]:
    """Tokens each request generates: all gen_tokens, or staggered, uniform in [gen_tokens/2, 3 gen_tokens/2]
    (seeded)."""
    if not staggered:
        return [gen_tokens] * n
    rng = random.Random(n)
    return [rng.randint(max(1, gen_tokens // 2), gen_tokens * 3 // 2) for _ in range(n)]


def synthetic_requests(
    tokenize,
    n: int,
    prompt_tokens: int,
    gen_tokens: int,
    first_id: int = 1,
    copy: bool = False,
    sampled: bool = False,
    staggered: bool = False,
) -> list[bytes]:
    """Encoded Submit records, as the frontend would write them: fresh prompts of exactly prompt_tokens, or copy tasks.

    Greedy, or with ``sampled`` temperature 0.7, top-p 0.9 and a seed of its own per request; each generates
    gen_tokens, or with ``staggered`` a length of its own (gen_lengths).
    """
    encode = msgspec.msgpack.Encoder().encode
    records = []
    lengths = gen_lengths(n, gen_tokens, staggered)

    def params(i: int) -> SamplingParams:
        if sampled:
            return SamplingParams(max_tokens=lengths[i], temperature=0.7, top_p=0.9, seed=first_id + i, ignore_eos=True)
        return SamplingParams(max_tokens=lengths[i], temperature=0.0, ignore_eos=True)

    if copy:
        tasks = list(copy_prompts().values())
        for i in range(n):
            tokens = tokenize(f"[{i}] {tasks[i % len(tasks)]}\n\nAnswer:\n")
            records.append(encode(Submit(first_id + i, tokens, params(i))))
        return records
    for i, text in enumerate(make_prompts(n, prompt_tokens)):
        tokens = tokenize(text)
        tokens = (tokens * (prompt_tokens // len(tokens) + 1))[:prompt_tokens]
        records.append(encode(Submit(first_id + i, tokens, params(i))))
    return records


def drive(
    engine, records: list[bytes], concurrency: int, totals: dict | None = None, arrivals: list[int] | None = None
) -> tuple[int, int, float]:
    """Run the records through the engine, at most `concurrency` at a time: (steps, tokens, seconds).

    ``arrivals``: the loop iteration each of the first records arrives at (the rest as others finish).
    """
    decode = msgspec.msgpack.Decoder(ToEngine).decode
    encode = msgspec.msgpack.Encoder().encode
    ring = Ring.create(OUTPUT_RING_BYTES)
    totals = totals if totals is not None else defaultdict(float)
    perf = time.perf_counter
    pending = deque(records)
    in_flight = steps = tokens = added = 0
    arrivals = arrivals or []
    ring.arm_wait()
    t0 = perf()
    try:
        while pending or engine.has_work():
            t = perf()
            while pending and in_flight < concurrency and (added >= len(arrivals) or arrivals[added] <= steps):
                engine.add(decode(pending.popleft()))
                in_flight += 1
                added += 1
            t1 = perf()
            published = 0.0
            for result in engine.step():  # first tokens, then the step's own outputs, each published as main.py does
                t2 = perf()
                ring.put(encode(StepOutputs(result.outputs)), wake=result.wake)
                published += perf() - t2
                tokens += len(result.outputs)
                in_flight -= sum(1 for o in result.outputs if o.finish is not None)
            t3 = perf()
            totals["admit"] += t1 - t
            totals["step"] += t3 - t1 - published
            totals["publish"] += published
            ring.end_wait()  # the frontend's side, woken by a put
            ring.drain()
            ring.arm_wait()
            steps += 1
    finally:
        ring.close()
        ring.close_fds()
    return steps, tokens, perf() - t0


def breakdown(totals: dict, seconds: float, timer: StepTimer | None) -> dict[str, float]:
    """Seconds per part: the step's from the engine's timer (without one, the step as one part); the loop's
    remainder is loop."""
    parts = {"admit": totals["admit"]}
    if timer is None:
        parts["step"] = totals["step"]
    else:
        parts.update(timer.wall)
    parts["publish"] = totals["publish"]
    parts["loop"] = seconds - sum(parts.values())
    return parts


def host_per_step(timer: StepTimer | None, steps: int) -> dict[str, dict[str, float]]:
    """Microseconds per step of the step's work outside llama_decode, by part: wall clock, and the engine
    thread's CPU time (steadier on a busy machine); "host" is the sum of the parts on the critical path,
    "overlapped" the work done while a decode ran."""
    if timer is None or not steps:
        return {}
    out = {}
    for kind, seconds in (("wall", timer.wall), ("cpu", timer.cpu)):
        parts = {k: 1e6 * seconds[k] / steps for k in HOST_PARTS}
        parts["host"] = sum(parts.values())
        parts["overlapped"] = 1e6 * seconds["overlapped"] / steps
        out[kind] = parts
    return out


def _timed(engine, records, concurrency: int, totals: dict, arrivals, profile: str | None) -> tuple:
    """drive()'s steps, tokens and seconds, under cProfile (written to ``profile``) or else the engine's step timer,
    which comes back with them."""
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        steps, tokens, seconds = drive(engine, records, concurrency, totals, arrivals)
        profiler.disable()
        profiler.dump_stats(profile)
        return steps, tokens, seconds, None
    timer = engine.timer = StepTimer()
    steps, tokens, seconds = drive(engine, records, concurrency, totals, arrivals)
    engine.timer = None
    return steps, tokens, seconds, timer


def bench(
    model: str,
    requests: int,
    concurrency: int,
    prompt_tokens: int,
    gen_tokens: int,
    threads: int,
    batch_size: int,
    profile: str | None = None,
    spec_type: SpecType = "none",
    copy: bool = False,
    sampled: bool = False,
    device_sampling: DeviceSampling = DEFAULTS.device_sampling,
    staggered: bool = False,
    steady: SteadySteps = DEFAULTS.steady_steps,
    model_draft: str | None = None,
) -> dict:
    from engine_proc.engine import LLMEngine  # loads llama.cpp: only when a bench runs

    longest = max(gen_lengths(requests, gen_tokens, staggered))
    seq_ctx = 256 * ((max(prompt_tokens, 1024 if copy else 0) + longest) // 256 + 1)
    config = ServeConfig(
        parallel=concurrency,
        ctx_size=seq_ctx * concurrency,
        threads=threads,
        batch_size=batch_size,
        spec_type=spec_type,
        device_sampling=device_sampling,
        steady_steps=steady,
        model_draft=model_draft,
    )
    engine = LLMEngine(model, config)
    try:
        tokenize = _tokenizer(engine)
        # The first decodes allocate llama.cpp's compute graphs: warm up untimed.
        drive(engine, synthetic_requests(tokenize, concurrency, prompt_tokens, 4, first_id=10**9), concurrency)
        records = synthetic_requests(
            tokenize, requests, prompt_tokens, gen_tokens, copy=copy, sampled=sampled, staggered=staggered
        )
        # Staggered: the first requests arrive spread over one mean generation length.
        arrivals = [k * gen_tokens // concurrency for k in range(concurrency)] if staggered else None
        totals: dict = defaultdict(float)
        decode_steps, reused_steps = engine.decode_steps, engine.reused_steps
        steps, tokens, seconds, timer = _timed(engine, records, concurrency, totals, arrivals, profile)
        decode_steps, reused_steps = engine.decode_steps - decode_steps, engine.reused_steps - reused_steps
        drafter = engine.drafter
        drafted, accepted = (drafter.drafted, drafter.accepted) if drafter else (0, 0)
    finally:
        engine.close()
    return {
        "requests": requests,
        "concurrency": concurrency,
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "threads": config.n_threads,
        "steps": steps,
        "generated_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "step_ms": 1000 * seconds / steps,
        "parts_seconds": breakdown(totals, seconds, timer),
        "host_us_per_step": host_per_step(timer, steps),
        "staggered": staggered,
        "steady": engine.scheduler.steady,
        "decode_steps": decode_steps,
        "reused_steps": reused_steps,
        "sampled": sampled,
        "device_sampling": engine.sampler.device,
        "copy": copy,
        "spec_type": ",".join(config.spec_types) or "none",  # a draft model alone is draft-simple, as the server
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
    }


def _tokenizer(engine):
    import llama_cpp as L

    vocab = engine.runner.vocab

    def tokenize(text: str) -> list[int]:
        data = text.encode()
        buf = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(vocab, data, len(data), buf, len(buf), True, True)
        return buf[:n]

    return tokenize


SWEEP = (1, 8, 32, 64)


def _parser(prog: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0].split(": ", 1)[1])
    ap.add_argument("--model", metavar="PATH", help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("-n", "--requests", type=int, default=40)
    ap.add_argument(
        "-c", "--concurrency", type=int, default=8, help="most requests in flight (the engine's --parallel)"
    )
    ap.add_argument("-p", "--prompt-tokens", type=int, default=26)
    ap.add_argument("-g", "--gen-tokens", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (default: one per core)")
    ap.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    ap.add_argument(
        "--spec-type",
        choices=["none", "ngram", "draft-simple", "ngram,draft-simple"],
        default="none",
        help="speculative decoding (default none; draft-simple needs --model-draft)",
    )
    ap.add_argument("--model-draft", metavar="PATH", help="a draft model GGUF for draft-simple (the server's -md)")
    ap.add_argument(
        "--prompts",
        choices=["fresh", "copy"],
        default="fresh",
        help="fresh: synthetic prompts of -p tokens; copy: tasks that copy or quote a ~600-token text",
    )
    ap.add_argument(
        "--arrivals",
        choices=["lockstep", "staggered"],
        default="lockstep",
        help="lockstep: every request generates -g tokens, the first C arrive at once; staggered: lengths "
        "uniform in [g/2, 3g/2], the first C arriving over g steps (default lockstep)",
    )
    ap.add_argument(
        "--steady",
        choices=["auto", "on", "off"],
        default="auto",
        help="keep the decode batch's shape between waves of arrivals and departures, so that llama.cpp "
        "reuses its graph (auto: with GPU layers, as the server does)",
    )
    ap.add_argument(
        "--sampled", action="store_true", help="temperature 0.7, top-p 0.9, a seed per request (default greedy)"
    )
    ap.add_argument(
        "--device-sampling",
        choices=["auto", "on", "off"],
        default=DEFAULTS.device_sampling,
        help="sample inside llama_decode where a request allows "
        f"(auto: with GPU layers; default {DEFAULTS.device_sampling})",
    )
    ap.add_argument(
        "--sweep",
        action="store_true",
        help=f"host us/step at concurrency {', '.join(map(str, SWEEP))}, greedy and sampled, "
        "2c requests each (-c, -n, --sampled ignored)",
    )
    ap.add_argument(
        "--profile", metavar="FILE", help="write a cProfile of the timed run (read it with python -m pstats FILE)"
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = _parser(prog)
    args = ap.parse_args(argv)
    for name in ("requests", "concurrency", "prompt_tokens", "gen_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        model = resolve_model(args.model)
    except ModelFileError as e:
        ap.error(str(e))
    run = lambda n, c, sampled, profile=None: bench(  # noqa: E731
        model,
        n,
        c,
        args.prompt_tokens,
        args.gen_tokens,
        args.threads or os.cpu_count() or 1,
        args.batch_size,
        profile,
        args.spec_type,
        args.prompts == "copy",
        sampled,
        args.device_sampling,
        args.arrivals == "staggered",
        args.steady,
        args.model_draft,
    )
    if args.sweep:
        results = [run(2 * c, c, sampled) for c in SWEEP for sampled in (False, True)]
        print(msgspec.json.encode(results).decode() if args.json else sweep_table(results))
        return 0
    r = run(args.requests, args.concurrency, args.sampled, args.profile)
    if args.json:
        print(msgspec.json.encode(r).decode())
    else:
        print(report(r))
    if args.profile:
        print(f"\nprofile written to {args.profile}; the top of it by own time:")
        pstats.Stats(args.profile, stream=sys.stdout).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
