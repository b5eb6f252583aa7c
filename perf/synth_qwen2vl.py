"""A made Qwen2-VL pair with random weights: a tiny text model (M-RoPE) and its projector (images of any size).

    python -m perf.synth_qwen2vl OUT_DIR [--seed 0]     # writes OUT_DIR/qwen2vl.gguf and OUT_DIR/mmproj-qwen2vl.gguf
    python -m perf.synth_qwen2vl OUT_DIR --kind qwen2.5vl_merger   # Qwen2.5-VL's projector instead
    python -m perf.synth_qwen2vl OUT_DIR --kind qwen3vl_merger     # Qwen3-VL's pair: a qwen3vl text model too

No Qwen2-VL model is reachable from this machine, and a model of this family differs from a LLaVA-style one in
the two ways the image path must follow: the text model ropes with M-RoPE (`qwen2vl`: four position components a
token, `rope.dimension_sections`), and its projector (`qwen2vl_merger`) takes an image at (about) its own size,
so an image of w x h pixels takes (w/16)*(h/16) embeddings for this pair (patch 8, 2x2 patches merged) but only
max(w, h)/16 positions. Metadata keys and tensor names are the vendored llama.cpp's (src/models/qwen2vl.cpp,
tools/mtmd/clip.cpp and models/qwen2vl.cpp); the two files take about 8 MB, most of it the vocabulary.

The text model: 2 layers of 64 wide, 4 heads of 16 (2 KV heads), rope sections 2/3/3/0 of the 8 rotated pairs a
head (Qwen2-VL's 16/24/24/0 of 64, scaled), the embedded SmolLM2's tokenizer and ChatML template (Qwen's own) with
Qwen2-VL's vision tokens added: <|vision_start|> and <|vision_end|>, which mtmd puts around an image, and
<|image_pad|>. The projector: a 2-layer ViT of 32 wide (M-RoPE over the patch grid, as Qwen2-VL's), then the
merger (LayerNorm, 4 patches' features to a 2-layer MLP) to the text model's width.

The weights are random (a fixed seed: the same files every time): they test the path (token and position
counts, M-RoPE positions, caching), never the quality of an answer.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import numpy as np

from perf import synth_model
from perf.synth_mmproj import Tower, tower_tensors, weights, write_gguf

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
CONTROL = 3  # llama_token_type of a special token
# The embeddings (tied to the output) small beside what the layers add: with them at the layers' size a token's
# own row outweighs the rest of its state in the logits and greedy decoding repeats the last token forever, a
# text that no change of position could alter.
EMBD_SCALE = 0.02
# The vision tower: 8-pixel patches, 2 x 2 of them merged into a token (clip.cpp's default for the family), so an
# image's sides are rounded to 16 pixels. Its image_size is Qwen2-VL's, which a tower that takes any size only logs.
TOWER = Tower(image_size=560, patch_size=8, n_embd=32, n_head=2, n_ff=64, n_layer=2)  # head_dim 16: 4 M-RoPE sections
MERGE = 2
ALIGN = TOWER.patch_size * MERGE  # pixels on a side of one image token


@dataclass(frozen=True)
class Text:
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_kv: int = 2
    n_ff: int = 128
    sections: tuple[int, int, int, int] = (2, 3, 3, 0)  # of head_dim / 2 rotated pairs
    rope_base: float = 10000.0
    context: int = 4096


def write_text(path: str, text: Text = Text(), seed: int = 0, arch: str = "qwen2vl") -> str:
    """The tiny text model to ``path``: F16 weights, F32 norms and biases. ``arch`` "qwen3vl": Qwen3-VL's (interleaved
    M-RoPE, q and k norms, no attention biases, no deepstack layers)."""
    import gguf  # the test extra's

    tok = synth_model.load_tokenizer()
    tokens = list(tok["tokenizer.ggml.tokens"][1][1]) + list(VISION_TOKENS)
    types = list(tok["tokenizer.ggml.token_type"][1][1]) + [CONTROL] * len(VISION_TOKENS)
    head_dim = text.n_embd // text.n_head
    if sum(text.sections) * 2 != head_dim:
        raise ValueError(f"the rope sections must cover head_dim / 2 = {head_dim // 2} pairs")
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"cllm synthetic {arch} (random weights, tests the image path)")
    writer.add_file_type(1)  # mostly F16
    writer.add_context_length(text.context)
    writer.add_embedding_length(text.n_embd)
    writer.add_block_count(text.n_layer)
    writer.add_feed_forward_length(text.n_ff)
    writer.add_head_count(text.n_head)
    writer.add_head_count_kv(text.n_kv)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(text.rope_base)
    writer.add_rope_dimension_sections(list(text.sections))
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"][1])
    writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"][1])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(tok["tokenizer.ggml.merges"][1][1]))
    writer.add_bos_token_id(tok["tokenizer.ggml.bos_token_id"][1])
    writer.add_eos_token_id(tok["tokenizer.ggml.eos_token_id"][1])
    writer.add_pad_token_id(tok["tokenizer.ggml.padding_token_id"][1])
    writer.add_add_bos_token(False)
    writer.add_chat_template(tok["tokenizer.chat_template"][1])  # ChatML, as Qwen's

    w, vec = weights(np.random.default_rng(seed))
    kv = text.n_kv * head_dim
    writer.add_tensor("token_embd.weight", w(len(tokens), text.n_embd, scale=EMBD_SCALE))
    for i in range(text.n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", vec(text.n_embd, 1.0))
        for name, rows in (("attn_q", text.n_embd), ("attn_k", kv), ("attn_v", kv)):
            writer.add_tensor(p + name + ".weight", w(rows, text.n_embd))
            if arch == "qwen2vl":
                writer.add_tensor(p + name + ".bias", vec(rows))
        if arch == "qwen3vl":
            writer.add_tensor(p + "attn_q_norm.weight", vec(head_dim, 1.0))
            writer.add_tensor(p + "attn_k_norm.weight", vec(head_dim, 1.0))
        writer.add_tensor(p + "attn_output.weight", w(text.n_embd, text.n_embd))
        writer.add_tensor(p + "ffn_norm.weight", vec(text.n_embd, 1.0))
        writer.add_tensor(p + "ffn_gate.weight", w(text.n_ff, text.n_embd))
        writer.add_tensor(p + "ffn_up.weight", w(text.n_ff, text.n_embd))
        writer.add_tensor(p + "ffn_down.weight", w(text.n_embd, text.n_ff))
    writer.add_tensor("output_norm.weight", vec(text.n_embd, 1.0))
    synth_model.finish(writer)
    return path


def write_projector(path: str, n_embd_text: int, seed: int = 0, kind: str = "qwen2vl_merger") -> str:
    """The projector to ``path``: the tower (no position embeddings, no patch bias: M-RoPE over the patch grid
    instead), the merger's norm (v.post_ln) and its MLP over 2 x 2 patches' features. ``kind`` "qwen2.5vl_merger":
    Qwen2.5-VL's, the same tensors read with RMS norms and window attention in every other block (windows of 112
    pixels: 7 x 7 tokens here)."""
    rng = np.random.default_rng(seed + 1)
    w, vec = weights(rng)
    t = tower_tensors(TOWER, rng, pre_ln=False)
    del t["v.patch_embd.bias"], t["v.position_embd.weight"]
    # Qwen2-VL's conv3d over 2 frames, as llama.cpp splits it: a 2D kernel a frame, both applied to a still image
    p = TOWER.patch_size
    t["v.patch_embd.weight"] = w(TOWER.n_embd, 3, p, p, scale=(6 * p * p) ** -0.5)
    t["v.patch_embd.weight.1"] = w(TOWER.n_embd, 3, p, p, scale=(6 * p * p) ** -0.5)
    merged = TOWER.n_embd * MERGE * MERGE
    t["v.post_ln.weight"], t["v.post_ln.bias"] = vec(TOWER.n_embd, 1.0), vec(TOWER.n_embd, 0.0)
    t["mm.0.weight"], t["mm.0.bias"] = w(merged, merged), vec(merged)
    t["mm.2.weight"], t["mm.2.bias"] = w(n_embd_text, merged), vec(n_embd_text)
    windows = {"clip__vision__n_wa_pattern": 2} if kind == "qwen2.5vl_merger" else {}
    if kind == "qwen3vl_merger":  # Qwen3-VL's tower: a patch bias, learned positions (resized to the grid), fused qkv
        t["v.patch_embd.bias"] = vec(TOWER.n_embd)
        t["v.position_embd.weight"] = (rng.standard_normal((TOWER.n_patches, TOWER.n_embd)) * 0.02).astype(np.float32)
        for i in range(TOWER.n_layer):
            b = f"v.blk.{i}."
            for part in ("weight", "bias"):
                qkv = [t.pop(f"{b}attn_{x}.{part}") for x in "qkv"]
                t[f"{b}attn_qkv.{part}"] = np.concatenate(qkv)
    return write_gguf(
        path,
        kind,
        TOWER,
        n_embd_text,
        t,
        **windows,
        clip__use_gelu=True,
        clip__vision__spatial_merge_size=MERGE,
        clip__vision__attention__layer_norm_epsilon=1e-6,
        clip__vision__image_mean=[0.48145466, 0.4578275, 0.40821073],
        clip__vision__image_std=[0.26862954, 0.26130258, 0.27577711],
    )


# projector kind -> (its text model's architecture, the projector's file name)
KINDS = {
    "qwen2vl_merger": ("qwen2vl", "mmproj-qwen2vl.gguf"),
    "qwen2.5vl_merger": ("qwen2vl", "mmproj-qwen25vl.gguf"),
    "qwen3vl_merger": ("qwen3vl", "mmproj-qwen3vl.gguf"),
}


def write(out_dir: str, seed: int = 0, kind: str = "qwen2vl_merger") -> tuple[str, str]:
    """Both files into ``out_dir``: (the text model, the projector of that kind)."""
    os.makedirs(out_dir, exist_ok=True)
    arch, name = KINDS[kind]
    return (
        write_text(os.path.join(out_dir, f"{arch}.gguf"), Text(), seed, arch),
        write_projector(os.path.join(out_dir, name), Text().n_embd, seed, kind),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kind", choices=sorted(KINDS), default="qwen2vl_merger")
    args = ap.parse_args()
    for path in write(args.out_dir, args.seed, args.kind):
        print(f"{path}: {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
