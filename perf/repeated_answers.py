"""Greedy answers asked twice in-process: where the repeated answer parts from the first one.

The copy tasks of perf/speculative.py, one at a time (or --concurrency at once), then all of them again,
on an engine with the prefix cache: for each prompt, the first token where
the repeated answer differs (its length where it does not), and how many of
the prompts answered alike. With speculation on, the memory of earlier
answers drafts a repeated answer only as far as it is the first one.

Usage:
    .venv/bin/python -m perf.repeated_answers [--model PATH|smollm2-f16] [--sets 1,2,3] [--spec-type none|ngram]
        [--max-tokens 256] [--draft-max 64] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

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
    ap.add_argument("--spec-type", default="none")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--draft-max", type=int, default=ServeConfig().draft_max)
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args()
    from engine_proc.engine import LLMEngine  # loads llama.cpp

    model = model_path(args.model) if args.model in MODELS else resolve_model(args.model)
    config = ServeConfig(
        parallel=args.concurrency,
        ctx_size=4096 * args.concurrency,
        threads=2,
        fixed_threads=True,
        spec_type=args.spec_type,
        draft_max=args.draft_max,
    )
    engine = LLMEngine(model, config)
    tokenizer = Tokenizer(model)
    template = tokenizer.chat_template()
    prompts = [
        tokenizer.encode(template.render([{"role": "user", "content": p}])) for k in args.sets for p in copy_tasks(k)
    ]
    drive(engine, synthetic_requests(tokenizer.encode, 1, 64, 4, first_id=10**9), 1)  # llama.cpp's graphs
    tokenizer.close()
    texts: dict[int, list[int]] = defaultdict(list)
    step = engine.step
    steps = [0]

    def recording():
        steps[0] += 1
        for result in step():
            for out in result.outputs:
                if out.token is not None:
                    texts[out.id].append(out.token)
            yield result

    engine.step = recording  # type: ignore[method-assign]
    encode = msgspec.msgpack.Encoder().encode
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    runs = []
    for first_id in (1, 1000):  # every prompt once, then every prompt again
        t, before = time.perf_counter(), steps[0]
        drive(engine, [encode(Submit(first_id + i, p, params)) for i, p in enumerate(prompts)], args.concurrency)
        runs.append(f"{time.perf_counter() - t:.1f} s, {steps[0] - before} steps")
    engine.close()
    print(
        f"# {model}: copy tasks of sets {args.sets}, c = {args.concurrency}, spec {args.spec_type}, "
        f"draft max {args.draft_max}, greedy, {args.max_tokens} tokens at most; first run {runs[0]}, repeated {runs[1]}"
    )
    alike = 0
    for i in range(len(prompts)):
        a, b = texts[1 + i], texts[1000 + i]
        n = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        alike += a == b
        print(f"prompt {i}: {len(a)} / {len(b)} tokens, " + ("alike" if a == b else f"parts at token {n}"))
    print(f"answered alike: {alike} of {len(prompts)}")


if __name__ == "__main__":
    main()
