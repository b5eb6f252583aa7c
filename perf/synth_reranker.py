"""A made reranker with random weights: a tiny Qwen3 with a classification head, as Qwen3-Reranker's GGUF is.

    python -m perf.synth_reranker OUT.gguf [--plain] [--shape tiny|small] [--seed 0]

llama.cpp scores a (query, document) pair with `--pooling rank`: the last token's hidden state (the model is causal)
through `cls.output` (one row per `qwen3.classifier.output_labels` entry), then a softmax for Qwen3; the score is the
first label's probability ("yes"). The prompt of a pair is the file's `tokenizer.chat_template.rerank` with {query}
and {document} filled in (Qwen3-Reranker's, here), or without one (``--plain``) BOS, query, EOS, SEP, document, EOS
as the vocabulary's add_bos/add_eos/add_sep flags say (BGE's form): llama-server's format_prompt_rerank, which
cllm's rerank route builds alike. No reranker comes this small and none is reachable from this machine, so it is
made with the embedded SmolLM2's tokenizer (perf/smollm2_tokenizer.json.xz): ``tiny`` (the tests': 64-wide, 2
layers, ~8 MiB) or ``small`` (SmolLM2-135M's shape, ~270 MiB: for timing, perf/rerank_beside_streams.py). Random
weights: the files test the path (prompts, pooling, the head, the same scores and ranking as llama-server's), never
the quality of a ranking. ``cached()`` makes each once into perf/cache/models/.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from perf import synth_model

# n_embd, n_layer, n_head, n_kv, head_dim, n_ff
SHAPES = {"tiny": (64, 2, 4, 2, 16, 128), "small": (576, 30, 9, 3, 64, 1536)}
LABELS = ("yes", "no")  # Qwen3-Reranker's head: P(yes) is the score
SEP = 0  # <|endoftext|>, the plain file's SEP (SmolLM2 has none of its own)
CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache", "models")

# Qwen3-Reranker's prompt (its GGUF's tokenizer.chat_template.rerank), with SmolLM2's <|im_start|>/<|im_end|>
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a web '
    "search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}"
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def write(path: str, plain: bool = False, seed: int = 0, shape: str = "tiny") -> str:
    """The reranker to ``path`` (written whole to a temporary name first, so a reader never sees half a file)."""
    import gguf

    n_embd, n_layer, n_head, n_kv, head_dim, n_ff = SHAPES[shape]
    tok = synth_model.load_tokenizer()
    tokens = list(tok["tokenizer.ggml.tokens"][1][1])
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:  # 1/sqrt(fan-in): activations near unit size through every layer
        return (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    part = f"{path}.{os.getpid()}.part"
    writer = gguf.GGUFWriter(part, "qwen3")
    name = "cllm synthetic reranker (random weights, tests the rerank path)"
    synth_model.write_shape(writer, name, 2048, n_embd, n_layer, n_ff, n_head, n_kv, head_dim)
    writer.add_classifier_output_labels(list(LABELS))
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"][1])
    writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"][1])
    writer.add_token_list(tokens)
    writer.add_token_types(list(tok["tokenizer.ggml.token_type"][1][1]))
    writer.add_token_merges(list(tok["tokenizer.ggml.merges"][1][1]))
    writer.add_bos_token_id(tok["tokenizer.ggml.bos_token_id"][1])
    writer.add_eos_token_id(tok["tokenizer.ggml.eos_token_id"][1])
    writer.add_pad_token_id(tok["tokenizer.ggml.padding_token_id"][1])
    writer.add_chat_template(tok["tokenizer.chat_template"][1])
    if plain:
        writer.add_sep_token_id(SEP)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(True)
        writer.add_add_sep_token(True)
    else:
        writer.add_add_bos_token(False)
        writer.add_string("tokenizer.chat_template.rerank", RERANK_TEMPLATE)

    writer.add_tensor("token_embd.weight", w(len(tokens), n_embd))  # tied: the output projection too
    for i in range(n_layer):
        p = f"blk.{i}."
        synth_model.write_attention(writer, p, w, n_embd, n_head, n_kv, head_dim)
        synth_model.write_ffn(writer, p, w, n_embd, n_ff)
    writer.add_tensor("output_norm.weight", ones(n_embd))
    writer.add_tensor("cls.output.weight", w(len(LABELS), n_embd))
    synth_model.finish(writer)
    os.replace(part, path)
    return path


def cached(plain: bool = False, shape: str = "tiny") -> str:
    """The made reranker's file in perf/cache/models/, made on first use (the same bytes every time: seed 0)."""
    path = os.path.join(CACHE, f"reranker-{shape}{'-plain' if plain else ''}.gguf")
    return synth_model.made(path, lambda p: write(p, plain, shape=shape))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--plain", action="store_true", help="no rerank template: BOS query EOS SEP document EOS")
    ap.add_argument("--shape", choices=SHAPES, default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{write(args.out, args.plain, args.seed, args.shape)}: {os.path.getsize(args.out) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
