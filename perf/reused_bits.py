"""Which prefills give a prompt's cells other bits: plain llama.cpp, no engine.

A chat prompt's first 36 cells are made in several ways, then its last token
is decoded alone at position 36 and its first token's top-2 logprobs printed:
the ways that print the same pair gave the same cells. Under flash attention
llama.cpp's CPU kernel takes 64 or more query rows of one stream in tiles and
fewer one by one (GGML_FA_TILE_Q), so the cells of a prefill of 64 rows or
more differ from the rest (docs/internals.md: What is exact). Usage:
    .venv/bin/python -m perf.reused_bits [--model PATH] [--threads 1,2]
"""

from __future__ import annotations

import argparse

import llama_cpp as L
import numpy as np

from cllm.core.llama_log import silence_llama_logs
from cllm.core.model_file import resolve_model
from frontend_proc.core.tokenizer import Tokenizer

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
PROMPT = SYSTEM + "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
FILLER = " the river and the mountain, seven blue engines by the ocean city" * 60


class Context:
    """A llama.cpp context of four streams, flash attention on, as the engine makes them."""

    def __init__(self, model, threads: int):
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.kv_unified = 4 * 512, 512, 512, 4, False
        p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
        p.n_threads = p.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(model, p)
        self.memory = L.llama_get_memory(self.ctx)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        self.batch = L.llama_batch_init(512, 0, 1)

    def decode(self, *runs: tuple[int, int, list[int]]) -> None:
        """One llama_decode of each (seq, first position, tokens) run; logits of the last row only."""
        rows = [(s, start + i, t) for s, start, tokens in runs for i, t in enumerate(tokens)]
        b = self.batch
        b.n_tokens = len(rows)
        for i, (s, pos, t) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, i == len(rows) - 1
            b.seq_id[i][0] = s
        if L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def top2(self) -> tuple[tuple[int, float], ...]:
        row = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).astype(np.float64)
        logprobs = row - row.max() - np.log(np.exp(row - row.max()).sum())
        return tuple((int(t), round(float(logprobs[t]), 4)) for t in np.argsort(-logprobs)[:2])

    def clear(self) -> None:
        for s in range(4):
            L.llama_memory_seq_rm(self.memory, s, -1, -1)


def ways(prompt: list[int], filler: list[int]):
    """(name, the calls that leave the prompt's first 36 cells in stream 1)."""
    head = prompt[:36]
    yield "prefilled alone", [((1, 0, head),)]
    yield "in chunks of 20 and 16", [((1, 0, head[:20]),), ((1, 20, head[20:]),)]
    yield "beside another stream's 10-token prompt", [((1, 0, head), (2, 0, filler[:10]))]
    yield "beside another stream's 70-token prompt", [((1, 0, head), (2, 0, filler[:70]))]
    yield "beside a 300-cell stream's decode row", [((2, 0, filler[:300]),), ((1, 0, head), (2, 300, filler[:1]))]
    for n in (56, 63, 64, 100, 300, 506):
        yield f"the first 36 of a {n}-token prefill", [((1, 0, head + filler[: n - 36]),)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", metavar="PATH")
    ap.add_argument("--threads", type=lambda s: [int(t) for t in s.split(",")], default=[1, 2])
    args = ap.parse_args()
    silence_llama_logs()
    L.llama_backend_init()
    path = resolve_model(args.model)
    tok = Tokenizer(path)
    prompt, filler = tok.encode(PROMPT), tok.encode(FILLER, add_special=False)
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    print(f"| threads | the first 36 of the {len(prompt)}-token prompt's cells | first token's top 2 (id, logprob) |")
    print("|---|---|---|")
    for threads in args.threads:
        ctx = Context(model, threads)
        for name, calls in ways(prompt, filler):
            ctx.clear()
            for runs in calls:
                ctx.decode(*runs)
            L.llama_memory_seq_rm(ctx.memory, 1, 36, -1)
            ctx.decode((1, 36, prompt[36:]))
            print(f"| {threads} | {name} | {ctx.top2()} |", flush=True)
        L.llama_free(ctx.ctx)


if __name__ == "__main__":
    main()
