"""cLLM's benchmark shape, side by side in one run: cllm's /generate vs raw llama.cpp.

40 requests x 50 tokens at concurrency 8 (non-streaming, ignore_eos), then
the same prompts through raw llama.cpp in waves of 8. Usage:
    .venv/bin/python -m perf.quick [--model PATH] [--requests 40] [--concurrency 8] [--gen-tokens 50]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

from cllm.model_file import resolve_model
from perf.http_load import run_load
from perf.prompts import make_prompts
from perf.raw_llama import run_raw


def serve(model: str, port: int, parallel: int, threads: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cllm.cli", "serve", "--model", model, "--port", str(port), "--parallel", str(parallel),
         "--threads", str(threads)],
        stdout=subprocess.PIPE, text=True,
    )
    for line in proc.stdout:
        if " at http://" in line:
            return proc
    raise RuntimeError("cllm serve did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--gen-tokens", type=int, default=50)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--port", type=int, default=18080)
    args = ap.parse_args()
    model = resolve_model(args.model)

    proc = serve(model, args.port, args.concurrency, args.threads)
    try:
        run_load(f"http://127.0.0.1:{args.port}", make_prompts(args.concurrency), args.concurrency, 5)  # warm-up
        http = run_load(f"http://127.0.0.1:{args.port}", make_prompts(args.requests), args.concurrency, args.gen_tokens)
    finally:
        proc.terminate()
        proc.wait(60)
    raw = run_raw(model, make_prompts(args.requests), args.concurrency, args.gen_tokens, args.threads)

    name = re.sub(r"\.gguf$", "", os.path.basename(model))
    print(f"{name}: {args.requests} requests x {args.gen_tokens} tokens, concurrency {args.concurrency}, {args.threads} threads")
    print(f"  cllm /generate : {http['tokens_per_second']:7.1f} tok/s  ({http['generated_tokens']} tokens, {http['errors']} errors, p50 latency {http['latency_p50']:.2f} s)")
    print(f"  raw llama.cpp  : {raw['tokens_per_second']:7.1f} tok/s  (prefill then decode, waves of {args.concurrency})")
    print(f"  ratio          : {http['tokens_per_second'] / raw['tokens_per_second']:.3f}")


if __name__ == "__main__":
    main()
