"""One embeddings request over HTTP against llama.cpp's own decode of the same tokens, in turns.

A cllm server (the embedded model unless --model, --threads 1 so both sides decode on one thread) answers
POST /v1/embeddings for one input; this process decodes the same tokens in an embeddings context of its own, made
as engine_proc/run/embedder.py makes it (mean pooling, flash attention off, one sequence). Rounds alternate the two;
the medians and spreads say what the server adds to llama.cpp's cost. Usage:
    .venv/bin/python -m perf.embed_overhead [--rounds 8] [--words 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx
import llama_cpp as L

from cllm.core.llama_log import silence_llama_logs
from cllm.core.model_file import resolve_model
from engine_proc.run.batch import Batch
from perf import servers


def raw_context(path: str):
    silence_llama_logs()
    L.llama_backend_init()
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.embeddings, cp.pooling_type = True, L.LLAMA_POOLING_TYPE_MEAN
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 512
    cp.n_seq_max, cp.kv_unified = 1, True
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.n_threads = cp.n_threads_batch = 1
    cp.no_perf = True
    return model, L.llama_init_from_model(model, cp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--words", type=int, default=30, help="words in the input")
    a = ap.parse_args()
    path = resolve_model(a.model)
    text = " ".join(f"word{i % 17}" for i in range(a.words))
    settings = servers.Settings(path, 1, 1, 512, ())
    _, ctx = raw_context(path)
    batch = Batch(512)
    http_s, raw_s = [], []
    with servers.start("cllm", settings, label="embed-overhead") as srv, httpx.Client(base_url=srv.url) as c:
        tokens = c.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
        c.post("/v1/embeddings", json={"input": text}).raise_for_status()  # makes the server's context
        for _ in range(a.rounds):
            t = time.perf_counter()
            c.post("/v1/embeddings", json={"input": text}, timeout=120).raise_for_status()
            http_s.append(time.perf_counter() - t)
            n = len(tokens)
            batch.token[:n], batch.pos[:n], batch.seq_id[:n], batch.logits[:n] = tokens, range(n), 0, 1
            t = time.perf_counter()
            batch.decode(ctx, n)
            raw_s.append(time.perf_counter() - t)
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
    for name, got in (("HTTP /v1/embeddings", http_s), ("llama_decode alone", raw_s)):
        print(
            f"{name}: {len(tokens)} tokens, median {statistics.median(got) * 1000:.1f} ms "
            f"({min(got) * 1000:.1f}-{max(got) * 1000:.1f}) over {a.rounds} rounds"
        )


if __name__ == "__main__":
    main()
