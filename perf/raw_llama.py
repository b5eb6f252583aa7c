"""The ceiling: raw llama.cpp through llama-cpp-python, no serving code at all.

Requests run in waves of `concurrency`: each wave prefills its prompts in one
batch, then decodes `gen_tokens` greedy tokens for all of them, one
llama_decode per step. Two figures per run: tokens/s over the whole run
(prefill then decode, what a server could at best deliver) and over the
decode steps alone. Both KV layouts can be measured: one stream per
sequence (`kv_unified` off, as cllm's engine and llama-server with -np run)
and one unified cache. The OpenMP settings are the engine's (engine_proc/__init__.py).

    python -m perf.raw_llama [--model PATH] [--concurrency 1,8,32] [--kv both] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import llama_cpp as L
import numpy as np

from cllm.bench.prompts import make_prompts, requests_for
from cllm.core.llama_log import silence_llama_logs
from cllm.core.model_file import resolve_model

KV_LAYOUTS = {"per-seq": False, "unified": True}


class RawLlama:
    def __init__(self, model_path: str, threads: int):
        silence_llama_logs()
        L.llama_backend_init()
        self.threads = threads
        self.model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, True)
        return buf[:n]

    def run(self, prompts: list[str], concurrency: int, gen_tokens: int, kv_unified: bool = False) -> dict:
        token_prompts = [self.tokenize(p) for p in prompts]
        longest = max(map(len, token_prompts))
        seq_ctx = 256 * ((longest + gen_tokens) // 256 + 1)
        cp = L.llama_context_default_params()
        cp.n_ctx = seq_ctx * concurrency
        cp.n_batch = max(512, longest * concurrency)
        cp.n_ubatch = 512
        cp.n_seq_max = concurrency
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.kv_unified = kv_unified
        cp.no_perf = True
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp could not create the context")
        mem = L.llama_get_memory(ctx)
        batch = L.llama_batch_init(cp.n_batch, 0, 1)

        def decode(entries: list[tuple[int, int, int, bool]]) -> None:
            for i, (tok, pos, seq, want) in enumerate(entries):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                batch.seq_id[i][0], batch.logits[i] = seq, want
            batch.n_tokens = len(entries)
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")

        def argmax_rows(n: int) -> list[int]:
            logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n, self.n_vocab))
            return logits.argmax(axis=1).tolist()

        # The first decode of a context allocates its compute graphs: not timed.
        decode([(t, p, s, True) for s in range(concurrency) for p, t in enumerate(token_prompts[0][:4])])
        L.llama_memory_clear(mem, True)

        generated = decode_tokens = 0
        decode_seconds = 0.0
        t0 = time.perf_counter()
        for w in range(0, len(token_prompts), concurrency):
            wave = token_prompts[w : w + concurrency]
            L.llama_memory_clear(mem, True)
            decode([(t, p, s, p == len(toks) - 1) for s, toks in enumerate(wave) for p, t in enumerate(toks)])
            last = argmax_rows(len(wave))
            generated += len(wave)
            t_decode = time.perf_counter()
            for step in range(1, gen_tokens):
                decode([(last[s], len(wave[s]) + step - 1, s, True) for s in range(len(wave))])
                last = argmax_rows(len(wave))
                generated += len(wave)
                decode_tokens += len(wave)
            decode_seconds += time.perf_counter() - t_decode
        elapsed = time.perf_counter() - t0

        L.llama_batch_free(batch)
        L.llama_free(ctx)
        return {
            "kv": "unified" if kv_unified else "per-seq",
            "concurrency": concurrency,
            "requests": len(prompts),
            "prompt_tokens_mean": sum(map(len, token_prompts)) / len(token_prompts),
            "gen_tokens": gen_tokens,
            "threads": self.threads,
            "generated_tokens": generated,
            "seconds": elapsed,
            "tokens_per_second": generated / elapsed,
            "decode_tokens_per_second": decode_tokens / decode_seconds if decode_seconds else None,
        }

    def close(self) -> None:
        L.llama_model_free(self.model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, help="requests per concurrency (default: 5 x concurrency, 8 to 160)")
    ap.add_argument("--concurrency", default="8", help="comma-separated list")
    ap.add_argument("--prompt-tokens", type=int, default=26)
    ap.add_argument("--gen-tokens", type=int, default=50)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--kv", choices=["per-seq", "unified", "both"], default="per-seq")
    ap.add_argument("--json", action="store_true", help="print one JSON list of results")
    args = ap.parse_args()

    raw = RawLlama(resolve_model(args.model), args.threads)
    layouts = list(KV_LAYOUTS) if args.kv == "both" else [args.kv]
    results = []
    for c in map(int, args.concurrency.split(",")):
        for kv in layouts:
            prompts = make_prompts(args.requests or requests_for(c), args.prompt_tokens)
            r = raw.run(prompts, c, args.gen_tokens, KV_LAYOUTS[kv])
            results.append(r)
            if not args.json:
                print(
                    f"raw llama.cpp c={c:<3} kv={kv:<8} {r['tokens_per_second']:7.1f} tok/s "
                    f"(decode only {r['decode_tokens_per_second'] or 0:7.1f}), {r['generated_tokens']} tokens in "
                    f"{r['seconds']:.1f} s"
                )
    raw.close()
    if args.json:
        json.dump(results, sys.stdout)
        print()


if __name__ == "__main__":
    main()
