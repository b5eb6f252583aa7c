"""A made vision projector (mmproj GGUF) with random weights, to test the image path where no vision model can go.

    python -m perf.synth_mmproj OUT.gguf [--text-model MODEL.gguf] [--tower tiny|vit-b16] [--seed 0]

It is a LLaVA-style projector (`clip.projector_type` "mlp", the simplest that llama.cpp's `clip` loader takes): a
tiny CLIP vision tower (patch embedding, learned positions, 2 pre-norm transformer blocks of which llama.cpp runs
the first, as LLaVA takes the second-to-last layer) and the two-layer MLP (mm.0, GELU, mm.2) whose output width is
the text model's embedding width (576 for the embedded SmolLM2, read from its GGUF). Every image becomes
(image_size / patch_size)^2 embeddings (64 by default), whatever its size: llama.cpp resizes it to image_size
square first. Metadata keys and tensor names are the ones the vendored llama.cpp's tools/mtmd/clip.cpp reads
(clip-impl.h); the file is under 1 MB. `--tower vit-b16` makes CLIP ViT-B/16's shape instead (224 px, 12 of
13 blocks run, 196 embeddings, 0.2 GB): random too, for timing an encode of a real size.

The weights are random (a fixed seed: the same file every time), so a model given this projector sees noise
where the image was: the file tests the path (loading, token and position counts, encoding, decoding, caching),
never the quality of an answer.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np

from perf import gguf_io, synth_model

PROJECTOR_TYPE = "mlp"


@dataclass(frozen=True)
class Tower:
    image_size: int = 64
    patch_size: int = 8
    n_embd: int = 64  # the vision tower's width
    n_head: int = 4
    n_ff: int = 128
    n_layer: int = 2  # llama.cpp runs n_layer - 1 of them for an "mlp" projector

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


# A ViT-B/16 tower at 224 px (CLIP's base shape, 196 embeddings an image, 0.2 GB): to time a real-sized encode.
TOWERS = {
    "tiny": Tower(),
    "vit-b16": Tower(image_size=224, patch_size=16, n_embd=768, n_head=12, n_ff=3072, n_layer=13),
}


def text_embedding_width(model_path: str) -> int:
    """A text GGUF's embedding width (`<arch>.embedding_length`): what the projector's output must match."""
    meta: dict[str, Any] = gguf_io.read_metadata(model_path)
    arch = meta["general.architecture"][1]
    width = meta[f"{arch}.embedding_length"][1]
    assert isinstance(width, int), f"{model_path}: {arch}.embedding_length is not an integer"
    return width


def weights(rng: np.random.Generator):
    """w(*shape): F16 weights of about unit gain; vec(n[, value]): an F32 vector, small random or all ``value``."""

    def w(*shape: int, scale: float = 0.0) -> np.ndarray:
        # 1/sqrt(fan-in) keeps the activations near unit size through every layer
        return (rng.standard_normal(shape) * (scale or shape[-1] ** -0.5)).astype(np.float16)

    def vec(n: int, value: float | None = None) -> np.ndarray:
        if value is not None:
            return np.full(n, value, np.float32)
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    return w, vec


def tower_tensors(tower: Tower, rng: np.random.Generator, pre_ln: bool = True) -> dict[str, np.ndarray]:
    """The vision tower's tensors (v.*), name -> array in numpy order (outermost dimension first: a ggml tensor's
    ne reversed); ``pre_ln``: CLIP's norm before the blocks (SigLIP has none)."""
    d, ff = tower.n_embd, tower.n_ff
    w, vec = weights(rng)
    t = {
        "v.patch_embd.weight": w(d, 3, tower.patch_size, tower.patch_size, scale=(3 * tower.patch_size**2) ** -0.5),
        "v.patch_embd.bias": vec(d),
        "v.position_embd.weight": (rng.standard_normal((tower.n_patches, d)) * 0.02).astype(np.float32),
    }
    if pre_ln:
        t["v.pre_ln.weight"], t["v.pre_ln.bias"] = vec(d, 1.0), vec(d, 0.0)
    for i in range(tower.n_layer):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            t[p + name + ".weight"] = w(d, d)
            t[p + name + ".bias"] = vec(d)
        t[p + "ln1.weight"], t[p + "ln1.bias"] = vec(d, 1.0), vec(d, 0.0)
        t[p + "ln2.weight"], t[p + "ln2.bias"] = vec(d, 1.0), vec(d, 0.0)
        t[p + "ffn_up.weight"], t[p + "ffn_up.bias"] = w(ff, d), vec(ff)
        t[p + "ffn_down.weight"], t[p + "ffn_down.bias"] = w(d, ff), vec(d)
    return t


def _tensors(tower: Tower, n_embd_text: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    t = tower_tensors(tower, rng)
    w, vec = weights(rng)
    t["mm.0.weight"], t["mm.0.bias"] = w(n_embd_text, tower.n_embd), vec(n_embd_text)
    t["mm.2.weight"], t["mm.2.bias"] = w(n_embd_text, n_embd_text), vec(n_embd_text)
    return t


def write_gguf(
    path: str, projector_type: str, tower: Tower, n_embd_text: int, tensors: dict[str, np.ndarray], **extra
) -> str:
    """A projector GGUF: clip's metadata for ``tower`` and ``projector_type``, ``extra`` keys (name -> int, float,
    bool or list, the name's dots given as __), and the tensors; returns ``path``."""
    import gguf  # the test extra's; imported here so that `text_embedding_width` needs only numpy

    if tower.image_size % tower.patch_size or tower.n_embd % tower.n_head:
        raise ValueError("image_size must be a multiple of patch_size, n_embd of n_head")
    writer = gguf.GGUFWriter(path, "clip")
    writer.add_string("general.type", "mmproj")
    writer.add_string("general.name", f"cllm synthetic {projector_type} projector (random weights)")
    writer.add_string("general.description", "tests the image path, not the quality: its weights are random")
    writer.add_uint32("general.file_type", 1)  # mostly F16
    writer.add_string("clip.projector_type", projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_uint32("clip.vision.image_size", tower.image_size)
    writer.add_uint32("clip.vision.patch_size", tower.patch_size)
    writer.add_uint32("clip.vision.embedding_length", tower.n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", tower.n_ff)
    writer.add_uint32("clip.vision.block_count", tower.n_layer)
    writer.add_uint32("clip.vision.attention.head_count", tower.n_head)
    writer.add_uint32("clip.vision.projection_dim", n_embd_text)
    for key, value in extra.items():
        key = key.replace("__", ".")
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_array(key, value)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    synth_model.finish(writer)
    return path


def write(path: str, n_embd_text: int, tower: Tower = Tower(), seed: int = 0) -> str:
    """Write the projector to ``path``; returns ``path``."""
    return write_gguf(
        path,
        PROJECTOR_TYPE,
        tower,
        n_embd_text,
        _tensors(tower, n_embd_text, np.random.default_rng(seed)),
        clip__use_gelu=True,
        clip__vision__attention__layer_norm_epsilon=1e-5,
        clip__vision__image_mean=[0.48145466, 0.4578275, 0.40821073],  # CLIP's
        clip__vision__image_std=[0.26862954, 0.26130258, 0.27577711],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--text-model", help="the text GGUF whose embedding width the output takes (default: embedded)")
    ap.add_argument("--tower", choices=TOWERS, default="tiny", help="the vision tower's shape (default: tiny)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.text_model is None:
        from cllm.core.model_file import embedded_model_path

        args.text_model = embedded_model_path()
    tower = TOWERS[args.tower]
    write(args.out, text_embedding_width(args.text_model), tower, args.seed)
    print(f"{args.out}: {tower.n_patches} embeddings an image, width {text_embedding_width(args.text_model)}")


if __name__ == "__main__":
    main()
