"""Speculation's work counted, not timed: the copy tasks of perf/speculative.py asked twice in-process, one at a time.

Wall time on this shared machine moves by 5-10% between runs of the same
thing; what a drafting policy changes is how many steps a run takes and how
many rows it verifies, which are counted exactly. So this prints, for the
first run and the repeated one: steps, drafted and kept tokens by where the
draft came from (the memory of earlier answers, or text), and the run's
decode time priced at fixed costs (--price: a step of one sequence, and what
a drafted token adds to it, measured once for the model at ~800 tokens of
context), beside the wall time.
Greedy text still parts at near ties between differently shaped steps, so
two policies' runs write different texts: use several text sets.

Usage:
    .venv/bin/python -m perf.spec_steps [--model PATH|smollm2-f16] [--sets 1,2,3] [--spec-memory MIB] [--max-tokens 256]
        [--price STEP_MS,DRAFTED_MS]
"""

from __future__ import annotations

import argparse
import time

import msgspec

from cllm.bench.engine_bench import drive, synthetic_requests
from cllm.core.config import ServeConfig
from cllm.core.model_file import resolve_model
from cllm.core.protocol import SamplingParams, Submit
from frontend_proc.core.tokenizer import Tokenizer
from perf.models import MODELS, model_path
from perf.speculative import copy_tasks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--sets", default="1,2,3", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--spec-memory", type=int, default=None, help="MiB of the memory of earlier answers (0: none)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument(
        "--price",
        default="10.8,4.7",
        type=lambda s: [float(x) / 1000 for x in s.split(",")],
        help="ms of a step of one sequence, ms a drafted token adds (default: the embedded Q4_1's; its F16: 12.4,3.3)",
    )
    args = ap.parse_args()
    from engine_proc.engine import LLMEngine  # loads llama.cpp

    model = model_path(args.model) if args.model in MODELS else resolve_model(args.model)
    memory = {} if args.spec_memory is None else {"spec_memory": args.spec_memory}
    engine = LLMEngine(model, ServeConfig(parallel=1, ctx_size=4096, threads=2, spec_type="ngram", **memory))
    drafter = engine.drafter
    assert drafter is not None
    tokenizer = Tokenizer(model)  # as the chat door renders and tokenizes a user's message
    template = tokenizer.chat_template()
    prompts = [
        tokenizer.encode(template.render([{"role": "user", "content": p}])) for k in args.sets for p in copy_tasks(k)
    ]
    drive(engine, synthetic_requests(tokenizer.encode, 1, 64, 4, first_id=10**9), 1)  # llama.cpp's graphs, untimed
    tokenizer.close()
    by_source: dict[bool, list[int]] = {}
    verified = drafter.verified

    def counting(seq, drafted: int, accepted: int) -> None:
        c = by_source.setdefault(seq.drafting.recalled, [0, 0, 0])
        c[0] += 1
        c[1] += drafted
        c[2] += accepted
        verified(seq, drafted, accepted)

    drafter.verified = counting  # type: ignore[method-assign]
    encode = msgspec.msgpack.Encoder().encode
    print(
        f"# {model}: copy tasks of sets {args.sets}, {len(prompts)} prompts, greedy, {args.max_tokens} tokens at most"
    )
    for run, first_id in (("first", 1), ("repeated", 1000)):
        records = [
            encode(Submit(first_id + i, p, SamplingParams(max_tokens=args.max_tokens, temperature=0.0)))
            for i, p in enumerate(prompts)
        ]
        by_source.clear()
        drafted0, kept0 = drafter.drafted, drafter.accepted
        t = time.perf_counter()
        steps, tokens, _ = drive(engine, records, 1)
        wall = time.perf_counter() - t
        drafted, kept = drafter.drafted - drafted0, drafter.accepted - kept0
        plain, per_draft = args.price
        priced = steps * plain + drafted * per_draft
        sources = ", ".join(
            f"{'memory' if src else 'text'} {n} drafts {d} drafted {a} kept" for src, (n, d, a) in by_source.items()
        )
        print(
            f"{run}: {tokens} tokens, {steps} steps, {drafted} drafted, {kept} kept ({sources}); decode priced "
            f"{priced:.2f} s; wall {wall:.2f} s, "
            f"{tokens / wall:.1f} tok/s",
            flush=True,
        )
    engine.close()


if __name__ == "__main__":
    main()
