"""GGUF files of a llama-family shape with random weights, for measuring speed where no real model can travel.

    python -m perf.synth_model PRESET OUT.gguf [--quant q4_k_m|q4_k|q4_1|q8_0|f16] [--seed 0] [--jobs N]
    python -m perf.synth_model --extract-tokenizer [MODEL.gguf]   # refreshes perf/smollm2_tokenizer.json.xz

Presets: smollm2 (the embedded model's shape: 135M, Q4_1 like its file), 1b (llama-3.2-1B-like), 8b
(llama-3-8B-like) and tiny (for dry runs). Every file gets the embedded model's tokenizer (vocabulary,
merges, token types, special ids, chat template), kept in perf/smollm2_tokenizer.json.xz.

The weights are random (a fixed seed: the same file every time), written straight in the quantized block
format with block scales chosen so that activations stay finite. Such a model's text is noise and it never
chooses to stop, so figures measured on it are for SPEED only: greedy or sampled decoding with ignore_eos,
never quality. q4_k_m mixes types as llama.cpp's Q4_K_M does (Q6_K for the output and for attn_v/ffn_down in
some layers, Q4_K elsewhere; Q5_0/Q8_0 where a row is not a multiple of 256).

Tensors are generated and written in parallel, each at its offset (no full copy in memory): an 8B Q4_K_M
file (~4.6 GB) takes seconds on 16 cores.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import sys
import time
from dataclasses import dataclass
from multiprocessing import Pool

import numpy as np

from perf import gguf_io as G

TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "smollm2_tokenizer.json.xz")


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_kv: int
    n_ff: int
    rope_base: float
    tied: bool  # the output projection is token_embd's (no output.weight)
    quant: str  # default quantization
    params: str  # size label


PRESETS = {
    "smollm2": Shape(576, 30, 9, 3, 1536, 100000.0, True, "q4_1", "135M"),
    "1b": Shape(2048, 16, 32, 8, 8192, 500000.0, True, "q4_k_m", "1.2B"),
    "8b": Shape(4096, 32, 32, 8, 14336, 500000.0, False, "q4_k_m", "7.5B"),
    "tiny": Shape(256, 4, 4, 2, 512, 10000.0, True, "q4_k_m", "10M"),
}
CONTEXT = 8192

# ggml types: id, (elements, bytes) per block
F32, F16, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 0, 1, 3, 6, 8, 12, 14
BLOCK = {F32: (1, 4), F16: (1, 2), Q4_1: (32, 20), Q5_0: (32, 22), Q8_0: (32, 34), Q4_K: (256, 144), Q6_K: (256, 210)}
# llama_ftype of each --quant (general.file_type)
FILE_TYPE = {"f16": 1, "q4_1": 3, "q8_0": 7, "q4_k": 14, "q4_k_m": 15}
FALLBACK = {Q4_K: Q5_0, Q6_K: Q8_0}  # llama.cpp's when a row is not a multiple of 256


def _more_bits(i: int, n: int) -> bool:
    """llama.cpp's Q4_K_M rule for the layers whose attn_v and ffn_down get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _type(quant: str, name: str, layer: int, shape: Shape, row: int) -> int:
    if name.endswith("norm.weight"):
        return F32
    if quant == "f16":
        t = F16
    elif quant == "q8_0":
        t = Q8_0
    elif quant == "q4_1":
        t = Q4_1
    elif quant == "q4_k":
        t = Q4_K
    elif name == "output.weight" or (name == "token_embd.weight" and shape.tied):
        t = Q6_K
    elif name.split(".")[-2] in ("attn_v", "ffn_down") and _more_bits(layer, shape.n_layer):
        t = Q6_K
    else:
        t = Q4_K
    return FALLBACK.get(t, t) if row % BLOCK[t][0] else t


def tensors(shape: Shape, quant: str) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, dims innermost first, ggml type) of every tensor, in llama.cpp's order."""
    head_dim = shape.n_embd // shape.n_head
    q, kv = shape.n_head * head_dim, shape.n_kv * head_dim
    vocab = len(load_tokenizer()["tokenizer.ggml.tokens"][1][1])
    dims: list[tuple[str, tuple[int, ...], int]] = [("token_embd.weight", (shape.n_embd, vocab), -1)]
    for i in range(shape.n_layer):
        dims += [
            (f"blk.{i}.attn_norm.weight", (shape.n_embd,), i),
            (f"blk.{i}.attn_q.weight", (shape.n_embd, q), i),
            (f"blk.{i}.attn_k.weight", (shape.n_embd, kv), i),
            (f"blk.{i}.attn_v.weight", (shape.n_embd, kv), i),
            (f"blk.{i}.attn_output.weight", (q, shape.n_embd), i),
            (f"blk.{i}.ffn_norm.weight", (shape.n_embd,), i),
            (f"blk.{i}.ffn_gate.weight", (shape.n_embd, shape.n_ff), i),
            (f"blk.{i}.ffn_up.weight", (shape.n_embd, shape.n_ff), i),
            (f"blk.{i}.ffn_down.weight", (shape.n_ff, shape.n_embd), i),
        ]
    dims.append(("output_norm.weight", (shape.n_embd,), -1))
    if not shape.tied:
        dims.append(("output.weight", (shape.n_embd, vocab), -1))
    return [(name, d, _type(quant, name, layer, shape, d[0])) for name, d, layer in dims]


def nbytes(dims: tuple[int, ...], ggml_type: int) -> int:
    per, size = BLOCK[ggml_type]
    return int(np.prod(dims)) // per * size


def _f16(x: float) -> np.ndarray:
    return np.frombuffer(np.float16(x).tobytes(), dtype=np.uint8)


def random_tensor(dims: tuple[int, ...], ggml_type: int, rng: np.random.Generator) -> np.ndarray:
    """Random data of a tensor in its block format; the scale gives weights of about 1/sqrt(row) deviation."""
    if ggml_type == F32:  # norm weights: 1, as a trained model's are near
        return np.ones(dims, dtype=np.float32)
    std = 1.0 / np.sqrt(dims[0])
    if ggml_type == F16:
        return (rng.standard_normal(int(np.prod(dims)), dtype=np.float32) * std).astype(np.float16)
    per, size = BLOCK[ggml_type]
    n = int(np.prod(dims)) // per * size
    blocks = rng.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n].reshape(-1, size)
    # The block scales (f16), from each format's spread of its random quants: w = d * q (+ a min).
    if ggml_type == Q8_0:  # int8 quants, deviation ~74
        blocks[:, 0:2] = _f16(std / 74)
    elif ggml_type == Q4_1:  # w = d*q + m, q in 0..15
        blocks[:, 0:2], blocks[:, 2:4] = _f16(std / 4.6), _f16(-7.5 * std / 4.6)
    elif ggml_type == Q5_0:  # w = d*(q - 16), q in 0..31
        blocks[:, 0:2] = _f16(std / 9.2)
    elif ggml_type == Q4_K:  # w = d*sc*q - dmin*m, sc and m random 6-bit: ~245 d
        blocks[:, 0:2], blocks[:, 2:4] = _f16(std / 245), _f16(7.5 * std / 245)
    elif ggml_type == Q6_K:  # w = d*sc*(q - 32), sc random int8: ~1370 d; d is the block's last field
        blocks[:, size - 2 : size] = _f16(std / 1370)
    return blocks


def _write_one(job: tuple[str, str, tuple[int, ...], int, int, int]) -> int:
    path, name, dims, ggml_type, offset, seed = job
    rng = np.random.default_rng([seed, *name.encode()])
    data = random_tensor(dims, ggml_type, rng).data.cast("B")
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], offset + done)
    finally:
        os.close(fd)
    return len(data)


def load_tokenizer() -> dict:
    with lzma.open(TOKENIZER, "rt", encoding="utf-8") as f:
        return {k: tuple(v) for k, v in json.load(f)["metadata"].items()}


def extract_tokenizer(model: str) -> None:
    """The tokenizer.* metadata of a GGUF file into perf/smollm2_tokenizer.json.xz."""
    meta = {k: v for k, v in G.read_metadata(model).items() if k.startswith("tokenizer.")}
    doc = {"source": os.path.basename(model), "metadata": meta}
    with lzma.open(TOKENIZER, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))


def made(path: str, make) -> str:
    """``path``, written by ``make(path)`` the first time it is asked for (the cached test models)."""
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        make(path)
    return path


def finish(writer) -> None:
    """Write a gguf.GGUFWriter's header, keys and tensors, and close its file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_shape(
    writer, name: str, context: int, n_embd: int, n_layer: int, n_ff: int, n_head: int, n_kv: int, head_dim: int
) -> None:
    """The name and shape keys of an F16 qwen3- or gemma3-shaped test model, in the order its cached file has them."""
    writer.add_name(name)
    writer.add_file_type(1)  # mostly F16
    writer.add_context_length(context)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)


def write_attention(
    writer, prefix: str, w, n_embd: int, n_head: int, n_kv: int, head_dim: int, qk_gain: float = 1.0
) -> None:
    """One layer's attention tensors as the qwen3- and gemma3-shaped test models write them (norm, Q K V O, the
    Q/K norms at ``qk_gain``), drawing from ``w`` in this order so a cached model file comes out bit for bit again."""
    writer.add_tensor(prefix + "attn_norm.weight", np.ones(n_embd, np.float32))
    writer.add_tensor(prefix + "attn_q.weight", w(n_head * head_dim, n_embd))
    writer.add_tensor(prefix + "attn_k.weight", w(n_kv * head_dim, n_embd))
    writer.add_tensor(prefix + "attn_v.weight", w(n_kv * head_dim, n_embd))
    writer.add_tensor(prefix + "attn_output.weight", w(n_embd, n_head * head_dim))
    writer.add_tensor(prefix + "attn_q_norm.weight", np.ones(head_dim, np.float32) * qk_gain)
    writer.add_tensor(prefix + "attn_k_norm.weight", np.ones(head_dim, np.float32) * qk_gain)


def write_ffn(writer, prefix: str, w, n_embd: int, n_ff: int) -> None:
    """One layer's gated feed-forward tensors (norm, gate, up, down), drawn from ``w`` in this order."""
    writer.add_tensor(prefix + "ffn_norm.weight", np.ones(n_embd, np.float32))
    writer.add_tensor(prefix + "ffn_gate.weight", w(n_ff, n_embd))
    writer.add_tensor(prefix + "ffn_up.weight", w(n_ff, n_embd))
    writer.add_tensor(prefix + "ffn_down.weight", w(n_embd, n_ff))


def metadata(preset: str, shape: Shape, quant: str) -> dict:
    meta = {
        "general.architecture": (G.STRING, "llama"),
        "general.name": (G.STRING, f"synthetic {preset} (random weights, for speed only)"),
        "general.size_label": (G.STRING, shape.params),
        "general.file_type": (G.UINT32, FILE_TYPE[quant]),
        "general.quantization_version": (G.UINT32, 2),
        "llama.block_count": (G.UINT32, shape.n_layer),
        "llama.context_length": (G.UINT32, CONTEXT),
        "llama.embedding_length": (G.UINT32, shape.n_embd),
        "llama.feed_forward_length": (G.UINT32, shape.n_ff),
        "llama.attention.head_count": (G.UINT32, shape.n_head),
        "llama.attention.head_count_kv": (G.UINT32, shape.n_kv),
        "llama.rope.freq_base": (G.FLOAT32, shape.rope_base),
        "llama.attention.layer_norm_rms_epsilon": (G.FLOAT32, 1e-5),
        "llama.rope.dimension_count": (G.UINT32, shape.n_embd // shape.n_head),
    }
    tok = load_tokenizer()
    meta["llama.vocab_size"] = (G.UINT32, len(tok["tokenizer.ggml.tokens"][1][1]))
    return {**meta, **tok}


def synthesize(preset: str, out: str, quant: str | None = None, seed: int = 0, jobs: int | None = None) -> str:
    shape = PRESETS[preset]
    quant = quant or shape.quant
    if quant not in FILE_TYPE:
        raise ValueError(f"unknown quantization {quant!r} (known: {', '.join(FILE_TYPE)})")
    spec = tensors(shape, quant)
    head, offsets = G.header(metadata(preset, shape, quant), [(n, d, t, nbytes(d, t)) for n, d, t in spec])
    last = spec[-1]
    size = offsets[-1] + nbytes(last[1], last[2])
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(head)
        f.truncate(size)
    work = [(tmp, n, d, t, o, seed) for (n, d, t), o in zip(spec, offsets)]
    work.sort(key=lambda w: -nbytes(w[2], w[3]))  # the largest first: the pool ends together
    with Pool(jobs or os.cpu_count()) as pool:
        for _ in pool.imap_unordered(_write_one, work):
            pass
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset", nargs="?", choices=sorted(PRESETS))
    ap.add_argument("out", nargs="?", help="the GGUF file to write")
    ap.add_argument("--quant", choices=sorted(FILE_TYPE), help="default: the preset's (smollm2 q4_1, others q4_k_m)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, help="processes writing tensors (default: one per CPU)")
    ap.add_argument(
        "--extract-tokenizer",
        nargs="?",
        const="",
        metavar="MODEL",
        help="write the tokenizer file from MODEL (default: the embedded model) and stop",
    )
    args = ap.parse_args(argv)
    if args.extract_tokenizer is not None:
        if not args.extract_tokenizer:
            from cllm.core.model_file import embedded_model_path

            args.extract_tokenizer = embedded_model_path()
        extract_tokenizer(args.extract_tokenizer)
        print(f"wrote {TOKENIZER} ({os.path.getsize(TOKENIZER)} bytes) from {args.extract_tokenizer}")
        return 0
    if not args.preset or not args.out:
        ap.error("PRESET and OUT are required")
    t0 = time.perf_counter()
    synthesize(args.preset, args.out, args.quant, args.seed, args.jobs)
    print(
        f"wrote {args.out}: {args.preset} {args.quant or PRESETS[args.preset].quant}, "
        f"{os.path.getsize(args.out) / 2**20:.0f} MiB in {time.perf_counter() - t0:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
