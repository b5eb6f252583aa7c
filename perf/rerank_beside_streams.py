"""A rerank batch beside 8 decoding streams, against an embeddings batch of the same tokens: what each delays them.

In-process on the engine (engine_proc/engine.py), stepped as `cllm serve --rerank` steps it: a made reranker of
SmolLM2-135M's shape (perf/synth_reranker.py, `small`), 8 sequences decoding (greedy, ignore_eos), and a batch of
--docs (query, document) prompts as the rerank route builds them (Tokenizer.rerank_prompt), given to the engine as
a rerank request, or as an embeddings request of the very same token lists. A round times the steps from the batch's
arrival to its last input (each step gives every stream one token); a round without a batch times as many plain
decode steps. Rounds go none, embeddings, rerank, --rounds times. Reported per kind: steps the batch took, and the
streams' milliseconds per token over them (median of rounds) and their longest step. Usage:
    .venv/bin/python -m perf.rerank_beside_streams [--docs 64] [--rounds 3] [--batch-size 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from cllm.core.config import ServeConfig
from cllm.core.protocol import Embed, SamplingParams, Submit
from engine_proc.engine import LLMEngine
from frontend_proc.core.tokenizer import Tokenizer
from perf import synth_reranker
from perf.embeddings import texts

STREAMS = 8
KINDS = ("none", "embeddings", "rerank")


def _step(eng: LLMEngine) -> float:
    t = time.perf_counter()
    for _ in eng.step():
        pass
    return time.perf_counter() - t


def _round(eng: LLMEngine, kind: str, prompts: list[list[int]], steps: int, first_id: int) -> list[float]:
    """The walls of the steps one batch of ``kind`` took beside the streams (``steps`` plain ones for none)."""
    ids = range(first_id, first_id + STREAMS)
    sampling = SamplingParams(max_tokens=4 * steps + 64, temperature=0, ignore_eos=True)
    for i in ids:
        eng.add(Submit(i, prompts[i % len(prompts)][:16], sampling))
    for _ in range(3):  # the prompts and a few decodes: every stream decodes from here on
        _step(eng)
    batch = first_id + STREAMS
    if kind != "none":
        eng.embed(Embed(batch, prompts, rank=kind == "rerank"))
    walls: list[float] = []
    while any(j.id == batch for j in eng.embedder.jobs) if kind != "none" else len(walls) < steps:
        walls.append(_step(eng))
    eng.abort(list(ids))
    while eng.has_work():
        _step(eng)
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=512)
    args = ap.parse_args()
    model = synth_reranker.cached(shape="small")
    tok = Tokenizer(model)
    prompts = [tok.rerank_prompt("Which passage speaks of a harbor?", doc[:160]) for doc in texts(args.docs)]
    tok.close()
    config = ServeConfig(parallel=STREAMS, ctx_size=STREAMS * 1024, batch_size=args.batch_size, rerank=True)
    eng = LLMEngine(model, config)
    results: dict[str, list[list[float]]] = {k: [] for k in KINDS}
    try:
        _round(eng, "rerank", prompts[:4], 4, 1000)  # warm-up: both contexts made
        _round(eng, "embeddings", prompts[:4], 4, 2000)
        n_steps = args.docs
        for r in range(args.rounds):
            for k, kind in enumerate(KINDS):
                walls = _round(eng, kind, prompts, n_steps, 10_000 * (r + 1) + 100 * k)
                results[kind].append(walls)
                if kind == "embeddings":
                    n_steps = len(walls)  # the plain rounds time as many steps
    finally:
        eng.close()
    tokens = sum(map(len, prompts))
    print(
        f"{args.docs} prompts ({tokens} tokens, {min(map(len, prompts))}-{max(map(len, prompts))} each) beside "
        f"{STREAMS} decoding streams; --batch-size {args.batch_size}; {args.rounds} rounds; "
        f"load {os.getloadavg()[0]:.2f} at the end"
    )
    print("\n| batch | steps it took | ms per stream token (median of rounds; each round) | longest step ms |")
    print("|---|---|---|---|")
    for kind in KINDS:
        per = [1000 * sum(w) / len(w) for w in results[kind]]
        rounds = ", ".join(f"{p:.1f}" for p in per)
        longest = max(1000 * max(w) for w in results[kind])
        steps = "/".join(str(len(w)) for w in results[kind])
        print(f"| {kind} | {steps} | {statistics.median(per):.1f} ({rounds}) | {longest:.1f} |")


if __name__ == "__main__":
    main()
