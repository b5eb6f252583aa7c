"""Can an image be encoded in a thread beside the decode loop, and what does it cost the decoding sequences?

The main thread decodes one token a step for --seqs sequences (as the engine's step does), while a second
thread, every other round, encodes one image with a made projector (perf/synth_mmproj.py, --tower). mtmd and
llama.cpp are called through ctypes, which lets go of the GIL, so the two run at once. Reported per round: the
decode steps' median wall and CPU time (the main thread's) with and without the encode beside them, and the
encode's own wall time. Rounds alternate (without, with, without, ...). Usage:
    .venv/bin/python -m perf.encode_beside_decode [--tower vit-b16] [--rounds 6] [--seqs 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import llama_cpp as L

from cllm.core.model_file import resolve_model
from engine_proc.vision.projector import Vision
from perf import image_files, synth_mmproj


def _print_rows(args: argparse.Namespace, n_embeddings: int, rows: list[tuple]) -> None:
    print(
        f"{args.tower} tower ({n_embeddings} embeddings), {args.seqs} sequences decoding, {args.threads} thread(s) each"
    )
    print("\n| round | encode beside | steps | step wall ms (median) | step CPU ms (median) | encode wall ms |")
    print("|---|---|---|---|---|---|")
    for i, (beside, n, wall, cpu, enc) in enumerate(rows):
        encoded = "" if enc is None else f"{enc:.0f}"
        print(f"| {i + 1} | {'yes' if beside else 'no'} | {n} | {wall:.1f} | {cpu:.1f} | {encoded} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tower", choices=synth_mmproj.TOWERS, default="vit-b16")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp's threads for the decode, and mtmd's")
    args = ap.parse_args()
    model_path = resolve_model(None)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = synth_mmproj.write(
            os.path.join(tmp, "mmproj.gguf"),
            synth_mmproj.text_embedding_width(model_path),
            synth_mmproj.TOWERS[args.tower],
        )
        vision = Vision(model, mmproj, n_threads=args.threads)
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 256 * args.seqs, 512, 512, args.seqs
    p.n_threads = p.n_threads_batch = args.threads
    ctx = L.llama_init_from_model(model, p)
    image = vision.image(image_files.png(image_files.picture(640, 480)))
    chunks = vision.tokenize([image])
    chunk = next(c for c in chunks if c.is_image)
    batch = L.llama_batch_init(args.seqs, 0, 1)
    pos = 0

    def step() -> tuple[float, float]:
        nonlocal pos
        for s in range(args.seqs):
            batch.token[s], batch.pos[s], batch.n_seq_id[s], batch.logits[s] = 100 + pos % 50, pos, 1, True
            batch.seq_id[s][0] = s
        batch.n_tokens = args.seqs
        w, c = time.perf_counter(), time.thread_time()
        assert L.llama_decode(ctx, batch) == 0
        pos += 1
        return time.perf_counter() - w, time.thread_time() - c

    for _ in range(3):  # warm up
        step()
    vision.encode(chunk)
    rows = []
    for r in range(2 * args.rounds):
        beside = r % 2 == 1
        encode_wall: list[float] = []
        done = threading.Event()

        def encode() -> None:
            t = time.perf_counter()
            vision.encode(chunk)
            encode_wall.append(time.perf_counter() - t)
            done.set()

        times = []
        if beside:
            threading.Thread(target=encode).start()
            while not done.is_set():
                times.append(step())
        else:
            times = [step() for _ in range(8)]
        if pos > 200:  # keep within each sequence's cells
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
            pos = 0
        rows.append(
            (
                beside,
                len(times),
                statistics.median(t[0] for t in times) * 1000,
                statistics.median(t[1] for t in times) * 1000,
                encode_wall[0] * 1000 if beside else None,
            )
        )
    _print_rows(args, chunk.n_tokens, rows)
    L.llama_batch_free(batch)
    chunks.close()
    image.close()
    vision.close()
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
