"""llama-server and engine_proc/vision/ on the same made projector and the same image: prompt tokens and greedy text.

llama-server (perf/cache/bin, `make bench-deps`) is started with the embedded model and `--mmproj` a projector from
perf/synth_mmproj.py. The same prompt with an image goes to its /completion (`multimodal_data`), and the same
chat, with and without the image, to its /v1/chat/completions (an `image_url` data URI); its prompt-token counts
are set beside what engine_proc.vision.projector counts for the prompt, and its greedy text beside the text of a greedy
decode through Vision + EmbdBatch. The projector's weights are random: the text is noise, only equality counts.
Usage:
    .venv/bin/python -m perf.vision_parity [--tokens 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import os
import tempfile

import httpx
import llama_cpp as L
import numpy as np

from cllm.core.model_file import resolve_model
from engine_proc.run.batch import EmbdBatch
from engine_proc.vision.projector import Chunks, Vision
from perf import image_files, servers, synth_mmproj

MARKER = "<__media__>"  # mtmd_default_marker()
PROMPT = f"<|im_start|>user\n{MARKER}\nWhat is in this picture?<|im_end|>\n<|im_start|>assistant\n"
QUESTION = "What is in this picture?"


def llama_server(model: str, mmproj: str, threads: int) -> servers.Server:
    port = servers.free_port()
    cmd = [
        servers.LLAMA_SERVER,
        "--model",
        model,
        "--mmproj",
        mmproj,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--parallel",
        "1",
        "--ctx-size",
        "2048",
        "--no-webui",
    ]
    # llama-server picks a random marker per process unless told one; /completion's prompt string needs it known
    env = {"LLAMA_MEDIA_MARKER": MARKER}
    return servers.launch("llama-server", cmd, port, "/health", env, label="llama-server-vision")


def prefill(vision: Vision, ctx, chunks: Chunks, seq: int = 0) -> int:
    """Decode the chunks into sequence ``seq`` from position 0 (text through llama_decode, an image encoded and its
    rows through EmbdBatch), the last position's logits asked for; the next position."""
    tokens = L.llama_batch_init(max(c.n_tokens for c in chunks), 0, 1)
    pos = 0
    try:
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            if chunk.tokens is None:
                EmbdBatch(chunk.n_tokens, vision.n_embd).decode(ctx, vision.encode(chunk), pos, seq, logits_last=last)
            else:
                fill(tokens, chunk.tokens.tolist(), pos, seq, last)
                assert L.llama_decode(ctx, tokens) == 0
            pos += chunk.n_pos
    finally:
        L.llama_batch_free(tokens)
    return pos


def fill(batch, toks: list[int], pos: int, seq: int, logits_last: bool) -> None:
    """A llama_batch_init batch: ``toks`` at positions pos.. of sequence ``seq``."""
    for j, t in enumerate(toks):
        batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = t, pos + j, 1, False
        batch.seq_id[j][0] = seq
    batch.logits[len(toks) - 1] = logits_last
    batch.n_tokens = len(toks)


def ours(vision: Vision, model, image_bytes: bytes, n_predict: int, threads: int) -> tuple[int, str]:
    """Prompt tokens as llama-server counts them (an image: its n_tokens) and the greedy text, through Vision."""
    vocab = L.llama_model_get_vocab(model)
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch = 2048, 2048, 512
    p.n_threads = p.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, p)
    image = vision.image(image_bytes)
    before, after = PROMPT.split(MARKER)
    chunks = vision.tokenize([before, image, after])
    one = L.llama_batch_init(1, 0, 1)
    try:
        pos = prefill(vision, ctx, chunks)
        out: list[int] = []
        n_vocab = L.llama_vocab_n_tokens(vocab)
        for _ in range(n_predict):
            t = int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (n_vocab,))))
            if L.llama_vocab_is_eog(vocab, t):
                break
            out.append(t)
            fill(one, [t], pos, 0, True)
            assert L.llama_decode(ctx, one) == 0
            pos += 1
        text = b"".join(_piece(vocab, t) for t in out).decode(errors="replace")
        return sum(c.n_tokens for c in chunks), text
    finally:
        L.llama_batch_free(one)
        chunks.close()
        image.close()
        L.llama_free(ctx)


def _piece(vocab, t: int) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = L.llama_token_to_piece(vocab, t, buf, len(buf), 0, False)
    return buf.raw[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    model_path = resolve_model(None)
    png = image_files.png(image_files.picture(64, 48, seed=5))
    b64 = base64.b64encode(png).decode()
    with tempfile.TemporaryDirectory() as tmp:
        mmproj = synth_mmproj.write(os.path.join(tmp, "mmproj.gguf"), synth_mmproj.text_embedding_width(model_path))
        with llama_server(model_path, mmproj, args.threads) as srv, httpx.Client(base_url=srv.url, timeout=600) as http:
            r = http.post(
                "/completion",
                json={
                    "prompt": {"prompt_string": PROMPT, "multimodal_data": [b64]},
                    "n_predict": args.tokens,
                    "temperature": 0,
                    "cache_prompt": False,
                },
            )
            r.raise_for_status()
            completion = r.json()

            def chat(content) -> dict:
                body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
                r = http.post("/v1/chat/completions", json=body)
                r.raise_for_status()
                return r.json()["usage"]

            with_image = chat(
                [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
                    {"type": "text", "text": QUESTION},
                ]
            )
            text_only = chat([{"type": "text", "text": QUESTION}])
        L.llama_backend_init()
        model = L.llama_model_load_from_file(model_path.encode(), L.llama_model_default_params())
        vision = Vision(model, mmproj, n_threads=args.threads)
        n_ours, text_ours = ours(vision, model, png, args.tokens, args.threads)
        n_image = synth_mmproj.Tower().n_patches
        vision.close()
        L.llama_model_free(model)
    print("| | llama-server | engine_proc.vision.projector |\n|---|---|---|")
    print(f"| /completion prompt tokens | {completion['tokens_evaluated']} | {n_ours} |")
    print(
        f"| chat prompt tokens with the image - without | {with_image['prompt_tokens'] - text_only['prompt_tokens']} "
        f"| {n_image} (the image's n_tokens) |"
    )
    print(f"| greedy text, {args.tokens} tokens | {completion['content']!r} | {text_ours!r} |")
    print(f"\nsame greedy text: {completion['content'] == text_ours}")


if __name__ == "__main__":
    main()
