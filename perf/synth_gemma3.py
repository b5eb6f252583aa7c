"""A made Gemma 3 vision model with random weights: a tiny text model of architecture gemma3 and its projector.

    python -m perf.synth_gemma3 OUT_DIR [--seed 0]     # writes OUT_DIR/gemma3-tiny.gguf and OUT_DIR/mmproj.gguf

Gemma 3's projector (`clip.projector_type` "gemma3" in the vendored llama.cpp's tools/mtmd/clip.cpp) is a SigLIP
tower, its patches average-pooled 4 x 4, an RMS norm (mm.soft_emb_norm) and one projection (mm.input_projection)
to the text model's width; mtmd puts `<start_of_image>` and `<end_of_image>` around an image's embeddings and
asks for non-causal attention while they decode (mtmd_decode_use_non_causal: every image row sees every other
row of its image). The tower here is 64 px in patches of 4, so an image takes 16 embeddings and 18 positions.

No Gemma 3 text model comes this small, and none is reachable from this machine, so the text model is made too:
architecture gemma3 (q/k norms, post-attention and post-FFN norms, GELU FFN, 5 sliding-window layers to a global
one as Gemma 3 has them, a window wider than the tests' prompts) with 64-wide embeddings. Unlike Gemma 3 its
output projection is its own, not the token embeddings: with random weights a tied one makes the greedy text
repeat one token, which would hide a wrong decode. Its tokenizer is the
embedded SmolLM2's (perf/smollm2_tokenizer.json.xz) with Gemma 3's special tokens added (<bos>, <eos>,
<start_of_turn>, <end_of_turn>, <start_of_image>, <end_of_image>) and Gemma 3's own chat template, so the
prompt has Gemma 3's form. Random weights: the files test the path (positions, non-causal decoding, counts, the
same text as mtmd's and llama-server's), never the quality of an answer.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from perf import synth_model
from perf.synth_mmproj import Tower, tower_tensors, weights, write_gguf

TOWER = Tower(image_size=64, patch_size=4, n_embd=64, n_head=4, n_ff=128, n_layer=2)
N_MERGE = 4  # clip.cpp's default pooling for gemma3: each side's patches / 4
N_IMAGE = (TOWER.image_size // TOWER.patch_size // N_MERGE) ** 2  # embeddings an image takes
N_EMBD, N_LAYER, N_HEAD, N_KV, HEAD_DIM, N_FF = 64, 6, 4, 1, 16, 256
# q and k norms' weight: attention as peaked as a trained model's (at 1, random q.k spread attention evenly, and
# an image's rows would hardly differ seen causally or not)
QK_GAIN = 2.0
SLIDING_WINDOW = 512  # Gemma 3 1B's
SPECIALS = ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>")
CONTROL = 3  # llama_token_type

# Gemma 3's chat template (google/gemma-3-*-it's tokenizer_config.json)
TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


def write_projector(path: str, n_embd_text: int = N_EMBD, seed: int = 0) -> str:
    """Gemma 3's projector (SigLIP tower, 4 x 4 pooling, soft-embedding norm, input projection) to ``path``."""
    rng = np.random.default_rng(seed)
    t = tower_tensors(TOWER, rng, pre_ln=False)
    w, vec = weights(rng)
    t["v.post_ln.weight"], t["v.post_ln.bias"] = vec(TOWER.n_embd, 1.0), vec(TOWER.n_embd, 0.0)
    t["mm.soft_emb_norm.weight"] = vec(TOWER.n_embd, 1.0)
    t["mm.input_projection.weight"] = w(TOWER.n_embd, n_embd_text, scale=TOWER.n_embd**-0.5)  # ne [text, vision]
    return write_gguf(
        path,
        "gemma3",
        TOWER,
        n_embd_text,
        t,
        clip__use_gelu=True,
        clip__vision__attention__layer_norm_epsilon=1e-6,
        clip__vision__image_mean=[0.5, 0.5, 0.5],  # SigLIP's
        clip__vision__image_std=[0.5, 0.5, 0.5],
    )


def write_text_model(path: str, seed: int = 0) -> str:
    """The tiny gemma3 text model to ``path``: F16 weights, F32 norms (1, as Gemma's converter stores 1 + w)."""
    import gguf

    tok = synth_model.load_tokenizer()
    tokens = list(tok["tokenizer.ggml.tokens"][1][1]) + list(SPECIALS)
    types = list(tok["tokenizer.ggml.token_type"][1][1]) + [CONTROL] * len(SPECIALS)
    special = {name: len(tokens) - len(SPECIALS) + i for i, name in enumerate(SPECIALS)}
    rng = np.random.default_rng(seed)
    w, _ = weights(rng)
    ones = lambda n: np.ones(n, np.float32)  # noqa: E731

    writer = gguf.GGUFWriter(path, "gemma3")
    name = "cllm synthetic gemma3 (random weights, tests the image path)"
    synth_model.write_shape(writer, name, 8192, N_EMBD, N_LAYER, N_FF, N_HEAD, N_KV, HEAD_DIM)
    writer.add_sliding_window(SLIDING_WINDOW)
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"][1])
    writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"][1])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(tok["tokenizer.ggml.merges"][1][1]))
    writer.add_bos_token_id(special["<bos>"])
    writer.add_eos_token_id(special["<eos>"])
    writer.add_eot_token_id(special["<end_of_turn>"])
    writer.add_pad_token_id(special["<eos>"])
    writer.add_add_bos_token(True)
    writer.add_chat_template(TEMPLATE)

    writer.add_tensor("token_embd.weight", w(len(tokens), N_EMBD))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        synth_model.write_attention(writer, p, w, N_EMBD, N_HEAD, N_KV, HEAD_DIM, QK_GAIN)
        writer.add_tensor(p + "post_attention_norm.weight", ones(N_EMBD))
        synth_model.write_ffn(writer, p, w, N_EMBD, N_FF)
        writer.add_tensor(p + "post_ffw_norm.weight", ones(N_EMBD))
    writer.add_tensor("output_norm.weight", ones(N_EMBD))
    writer.add_tensor("output.weight", w(len(tokens), N_EMBD))
    synth_model.finish(writer)
    return path


def write(out_dir: str, seed: int = 0) -> tuple[str, str]:
    """Both files into ``out_dir``: (the text model, the projector)."""
    return (
        write_text_model(os.path.join(out_dir, "gemma3-tiny.gguf"), seed),
        write_projector(os.path.join(out_dir, "mmproj.gguf"), N_EMBD, seed),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for path in write(args.out_dir, args.seed):
        print(f"{path}: {os.path.getsize(path) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
