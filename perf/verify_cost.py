"""What verifying k drafted tokens costs against a one-token decode step, on this machine.

Speculation pays when the tokens a step keeps save more decode steps than the
drafted tokens add to it. This times ``ModelRunner.decode`` (the engine's own
path: every drafted row gets its logits) for n sequences at position --pos,
each feeding its last token plus k drafted ones, and prints the step's time,
its ratio to the step without drafts (k = 0), and what one drafted token adds.
The k's take turns within each round, so a shared machine's drift spreads
over all of them; the figure is the median of the rounds. Usage:
    .venv/bin/python -m perf.verify_cost [--model PATH] [--sequences 1,8] [--drafts 0,1,2,4,8,16,32,64]
        [--pos 600] [--flash-attn auto|on|off]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from cllm.core.protocol import SamplingParams
from engine_proc.run.model_runner import ModelRunner
from engine_proc.sequence import Chunk, Sequence


def prefill(runner: ModelRunner, n: int, pos: int) -> list[Sequence]:
    """n sequences of ``pos`` random prompt tokens, their KV cells filled, one sampled token each."""
    rng = np.random.default_rng(0)
    seqs = []
    for s in range(n):
        seq = Sequence(s, rng.integers(100, 10000, pos).astype(np.int32), SamplingParams(), None, slot=s)  # type: ignore[arg-type]  # no sampler: never sampled
        for a in range(0, pos, 256):
            runner.fill([Chunk(seq, a, min(a + 256, pos))])
            runner.decode()
        seq.n_cached = pos
        seq.output.append(int(rng.integers(100, 10000)))
        seqs.append(seq)
    return seqs


def step_seconds(runner: ModelRunner, seqs: list[Sequence], pos: int, k: int, drafts: np.ndarray) -> float:
    chunks = [Chunk(s, pos, pos + 1 + k, drafts[:k] if k else None) for s in seqs]
    t = time.perf_counter()
    runner.fill(chunks)
    runner.decode()
    seconds = time.perf_counter() - t
    for s in seqs:
        runner.trim(s.slot, pos)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="GGUF file (default: the embedded SmolLM2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pos", type=int, default=600, help="tokens already in each sequence's KV cache")
    ap.add_argument("--sequences", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--drafts", default="0,1,2,4,8,16,32,64", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"), help="llama.cpp's flash attention")
    args = ap.parse_args()
    model = resolve_model(args.model)
    top = max(args.sequences)
    budget = max(top * (1 + max(args.drafts)), 256)
    config = ServeConfig(
        parallel=top,
        ctx_size=top * 256 * ((args.pos + max(args.drafts)) // 256 + 2),
        threads=args.threads,
        batch_size=budget,
        cache_slots=0,
        flash_attn=args.flash_attn,
    )
    runner = ModelRunner(model, config)
    try:
        seqs = prefill(runner, top, args.pos)
        drafts = np.random.default_rng(1).integers(100, 10000, max(args.drafts)).astype(np.int32)
        print(
            f"# {os.path.basename(model)}, {config.n_threads} threads, flash attention {args.flash_attn}, "
            f"position {args.pos}, "
            f"median of {args.rounds} rounds, load average {os.getloadavg()[0]:.1f} at the start\n"
        )
        for n in args.sequences:
            for k in args.drafts[:2]:  # untimed: llama.cpp allocates its graphs on the first decodes
                step_seconds(runner, seqs[:n], args.pos, k, drafts)
            times: dict[int, list[float]] = {k: [] for k in args.drafts}
            for _ in range(args.rounds):
                for k in args.drafts:
                    times[k].append(step_seconds(runner, seqs[:n], args.pos, k, drafts))
            ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
            base = ms[args.drafts[0]]
            print(f"## {n} sequence{'s' * (n > 1)}, each feeding its last token and k drafted ones\n")
            print(
                "| k drafted | step ms | x the step with k = 0 | ms a drafted token adds | ms a decoded token costs |"
            )
            print("|---|---|---|---|---|")
            for k in args.drafts:
                add = f"{(ms[k] - base) / (n * k):.2f}" if k else "-"
                print(f"| {k} | {ms[k]:.1f} | {ms[k] / base:.2f} | {add} | {base / n:.2f} |")
            print()
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        runner.close()


if __name__ == "__main__":
    main()
