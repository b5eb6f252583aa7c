"""The ceiling: raw llama.cpp through llama-cpp-python, no serving code at all.

Requests run in waves of `concurrency`: each wave prefills its prompts in one
batch, then decodes `gen_tokens` greedy tokens for all of them, one
llama_decode per step. Same model file, threads and per-sequence KV layout
as cllm's engine, so the two are comparable.
"""

from __future__ import annotations

import argparse
import ctypes
import time

import llama_cpp as L
import numpy as np

from cllm.llama_log import silence_llama_logs
from cllm.model_file import resolve_model
from perf.prompts import make_prompts


def run_raw(model_path: str, prompts: list[str], concurrency: int, gen_tokens: int, threads: int) -> dict:
    silence_llama_logs()
    L.llama_backend_init()
    model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    def tokenize(text: str) -> list[int]:
        data = text.encode()
        buf = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(vocab, data, len(data), buf, len(buf), True, True)
        return buf[:n]

    token_prompts = [tokenize(p) for p in prompts]
    longest = max(map(len, token_prompts))
    seq_ctx = 256 * ((longest + gen_tokens) // 256 + 1)
    cp = L.llama_context_default_params()
    cp.n_ctx = seq_ctx * concurrency
    cp.n_batch = max(512, longest * concurrency)
    cp.n_ubatch = 512
    cp.n_seq_max = concurrency
    cp.n_threads = cp.n_threads_batch = threads
    cp.kv_unified = False
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
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
        logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n, n_vocab))
        return logits.argmax(axis=1).tolist()

    generated = 0
    t0 = time.perf_counter()
    for w in range(0, len(token_prompts), concurrency):
        wave = token_prompts[w : w + concurrency]
        L.llama_memory_clear(mem, True)
        entries = [(t, p, s, p == len(toks) - 1) for s, toks in enumerate(wave) for p, t in enumerate(toks)]
        decode(entries)
        last = argmax_rows(len(wave))
        generated += len(wave)
        for step in range(1, gen_tokens):
            decode([(last[s], len(wave[s]) + step - 1, s, True) for s in range(len(wave))])
            last = argmax_rows(len(wave))
            generated += len(wave)
    elapsed = time.perf_counter() - t0

    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return {"requests": len(prompts), "generated_tokens": generated, "seconds": elapsed, "tokens_per_second": generated / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--gen-tokens", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    import os

    r = run_raw(resolve_model(args.model), make_prompts(args.requests), args.concurrency, args.gen_tokens, args.threads or os.cpu_count())
    print(f"raw llama.cpp: {r['generated_tokens']} tokens in {r['seconds']:.2f} s = {r['tokens_per_second']:.1f} tok/s")


if __name__ == "__main__":
    main()
