"""What one image costs in the engine: check + decode (+ pixel hash), tokenize, encode, and the decode of its
embeddings into a sequence, each timed over rounds, beside a prefill of as many text tokens; with a made
projector (perf/synth_mmproj.py) on the embedded model unless given others. Prints a Markdown table of the
median, min and max per stage, wall time and the calling thread's CPU time (with --threads 1 llama.cpp and mtmd
compute on that thread, so the CPU time holds still when other programs share the CPUs). Usage:
    .venv/bin/python -m perf.image_encode [--model PATH] [--mmproj PATH] [--tower tiny|vit-b16] [--rounds 20]
        [--threads 2] [--size 640]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import llama_cpp as L

from cllm.core.model_file import resolve_model
from engine_proc.run.batch import EmbdBatch
from engine_proc.vision.projector import Vision
from perf import image_files, synth_mmproj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--mmproj", help="default: a made one (perf/synth_mmproj.py, random weights) of --tower's shape")
    ap.add_argument("--tower", choices=synth_mmproj.TOWERS, default="tiny")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=640, help="the PNG's width (height 3/4 of it)")
    args = ap.parse_args()
    model_path = resolve_model(args.model)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = args.mmproj or synth_mmproj.write(
            os.path.join(tmp, "mmproj.gguf"),
            synth_mmproj.text_embedding_width(model_path),
            synth_mmproj.TOWERS[args.tower],
        )
        vision = Vision(model, mmproj, n_threads=args.threads)
    p = L.llama_context_default_params()
    p.n_ctx = p.n_batch = p.n_ubatch = 2048
    p.n_threads = p.n_threads_batch = args.threads
    ctx = L.llama_init_from_model(model, p)
    memory = L.llama_get_memory(ctx)
    data = image_files.png(image_files.picture(args.size, args.size * 3 // 4 // 8 * 8))
    stages = ("check + decode + hash", "tokenize", "encode", "decode embeddings", "prefill as many text tokens")
    wall: dict[str, list[float]] = {s: [] for s in stages}
    cpu: dict[str, list[float]] = {s: [] for s in stages}
    n_tokens = 0
    tokens = L.llama_batch_init(2048, 0, 1)
    for r in range(args.rounds + 1):  # the first round warms up, not counted
        marks = [(time.perf_counter(), time.thread_time())]
        image = vision.image(data)
        marks.append((time.perf_counter(), time.thread_time()))
        chunks = vision.tokenize([image])
        marks.append((time.perf_counter(), time.thread_time()))
        chunk = next(c for c in chunks if c.is_image)
        rows = vision.encode(chunk)
        marks.append((time.perf_counter(), time.thread_time()))
        EmbdBatch(len(rows), vision.n_embd).decode(ctx, rows, 0, 0, logits_last=True)
        marks.append((time.perf_counter(), time.thread_time()))
        L.llama_memory_seq_rm(memory, 0, -1, -1)
        n_tokens = chunk.n_tokens
        for j in range(n_tokens):
            tokens.token[j], tokens.pos[j], tokens.n_seq_id[j], tokens.logits[j] = 100 + j, j, 1, j == n_tokens - 1
            tokens.seq_id[j][0] = 0
        tokens.n_tokens = n_tokens
        marks.append((time.perf_counter(), time.thread_time()))
        assert L.llama_decode(ctx, tokens) == 0
        marks.append((time.perf_counter(), time.thread_time()))
        L.llama_memory_seq_rm(memory, 0, -1, -1)
        chunks.close()
        image.close()
        spans = [(marks[i], marks[i + 1]) for i in (0, 1, 2, 3, 5)]
        for stage, (a, b) in zip(stages, spans):
            if r:
                wall[stage].append((b[0] - a[0]) * 1000)
                cpu[stage].append((b[1] - a[1]) * 1000)
    L.llama_batch_free(tokens)
    print(
        f"{len(data)}-byte PNG, {args.size}x{args.size * 3 // 4 // 8 * 8}, {n_tokens} embeddings, "
        f"{args.threads} threads, {args.rounds} rounds"
    )
    print("\n| stage | wall ms: median | min | max | CPU ms: median | min | max |\n|---|---|---|---|---|---|---|")
    for stage in stages:
        w, c = wall[stage], cpu[stage]
        print(
            f"| {stage} | {statistics.median(w):.2f} | {min(w):.2f} | {max(w):.2f} "
            f"| {statistics.median(c):.2f} | {min(c):.2f} | {max(c):.2f} |"
        )
    vision.close()
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
